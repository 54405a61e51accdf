"""Logic only, no servers: months, gift codes, URL masking, queue bodies, backoff, SQL, settings."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.periods import current_month, month, parse_month

from batchrun.db.sql import Queries, load, migration_steps, parse
from batchrun.errors import ConfigError, causes
from batchrun.jobs.birthday import Birthday, codes
from batchrun.period import Period, Unit
from batchrun.queue import base as queue_base
from batchrun.queue.base import MAX_BODY, PoisonMessage, QueueMessage, backoff_s
from batchrun.settings import DEFAULT_DB, DEFAULT_MAIL, Settings
from batchrun.urls import mask_text, mask_url, shown, split

UNITS: dict[str, Unit] = {"birthday": "month"}  # jobs a consumer parses bodies for

# -- months ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "year", "month"),
    [
        ("2025-06", 2025, 6),
        ("2025-01", 2025, 1),
        ("2025-12", 2025, 12),
        ("1900-01", 1900, 1),
        ("9999-12", 9999, 12),
        (" 2024-02 ", 2024, 2),
    ],
)
def test_parse_month_valid(text: str, year: int, month: int) -> None:
    parsed = parse_month(text)
    assert (parsed.year, parsed.month) == (year, month)
    assert str(parsed) == f"{year:04d}-{month:02d}"


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "2025-13",
        "2025-00",
        "25-06",
        "2025/06",
        "202506",
        "2025-06-01",
        "2025-006",
        "12025-06",
        "1899-12",
        "0000-01",
        "june",
        "2025-O6",
        "-2025-06",
        "2025-06x",
    ],
)
def test_parse_month_invalid(text: str) -> None:
    """Malformed or ambiguous months are refused (2025-6 is not ambiguous: see below)."""
    with pytest.raises(ValueError) as info:
        parse_month(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message  # names the bad value
    assert "YYYY-MM" in message


def test_month_orders_and_prints() -> None:
    assert month(2024, 12) < month(2025, 1) < month(2025, 2)
    assert str(month(987, 3)) == "0987-03"


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (datetime(2025, 6, 15, 12, 0, tzinfo=UTC), month(2025, 6)),
        (datetime(2025, 12, 31, 23, 59, 59, tzinfo=UTC), month(2025, 12)),
        (datetime(2026, 1, 1, 0, 0, tzinfo=UTC), month(2026, 1)),
    ],
)
def test_month_current_with_fixed_time(now: datetime, expected: Period) -> None:
    assert current_month(now) == expected


def test_month_current_defaults_to_utc_now() -> None:
    before = datetime.now(UTC)
    got = current_month()
    after = datetime.now(UTC)
    assert got in {month(before.year, before.month), month(after.year, after.month)}


def test_month_current_converts_aware_time_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert current_month(datetime(2026, 1, 1, 1, 0, tzinfo=plus_two)) == month(2025, 12)


# -- gift codes ------------------------------------------------------------------------------


def test_code_length_and_alphabet() -> None:
    assert len(codes.ALPHABET) == 32
    assert set(codes.ALPHABET) == set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    for _ in range(1000):
        code = codes.new_code()
        assert len(code) == 16
        assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{16}", code), code
        assert not set(code) & set("ILOU")


def test_codes_unique_and_use_every_character() -> None:
    made = [codes.new_code() for _ in range(100_000)]
    assert len(set(made)) == len(made)
    seen = set("".join(made[:2000]))
    assert seen == set(codes.ALPHABET)  # 32k draws: every character shows up


def test_a_batch_of_codes_is_as_random_as_single_draws() -> None:
    """new_codes(n) cuts one draw into n codes: each full length, distinct, and every
    position uniform over the alphabet (chi-square, 31 degrees of freedom)."""
    made = codes.new_codes(64_000)
    assert len(made) == 64_000 and len(set(made)) == 64_000
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{16}", code) for code in made)
    expected = len(made) / 32
    for position in range(16):
        counts = Counter(code[position] for code in made)
        chi2 = sum((counts[c] - expected) ** 2 / expected for c in codes.ALPHABET)
        assert chi2 < 70, (position, chi2)  # p < 1e-4 for a fair alphabet
    assert codes.new_codes(0) == []


def test_code_uses_secrets_not_random() -> None:
    random.seed(1)
    first = codes.new_code()
    random.seed(1)
    assert codes.new_code() != first


def test_code_display_grouping() -> None:
    assert codes.display("ABCDEFGHJKMNPQRS") == "ABCD-EFGH-JKMN-PQRS"
    assert codes.display("ABCDEFGHJK") == "ABCD-EFGH-JK"  # any other length, grouped alike
    code = codes.new_code()
    shown = codes.display(code)
    assert re.fullmatch(r"[0-9A-Z]{4}(-[0-9A-Z]{4}){3}", shown)
    assert shown.replace("-", "") == code


# -- masking ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("mysql://root:s3cretpw@127.0.0.1:3306/app", "s3cretpw"),
        ("mysql://root:p%40ss%2Fw%3Ard@db.internal/app", "p%40ss%2Fw%3Ard"),
        ("mysql://app:pa:ss@db/app", "pa:ss"),
        ("mysql://app:pa#ss@db/app", "pa#ss"),
        ("mysql://app:pa?ss@db/app", "pa?ss"),
        ("smtps://mailer%40example.com:Tr0ub4dor&3@smtp.example.com:465", "Tr0ub4dor&3"),
        ("https://key:topsecret@sqs.eu-west-1.amazonaws.com/1/q", "topsecret"),
        ("mysql://:onlypw@db/app", "onlypw"),
    ],
)
def test_mask_url_hides_password(url: str, password: str) -> None:
    masked = mask_url(url)
    assert password not in masked
    assert "***" in masked
    host = url.rsplit("@", 1)[1]
    assert masked.endswith(host)  # the rest of the URL is still there to read
    # What a driver would be given (None when '#' or '?' ends the netloc early).
    as_parsed = urlsplit(url).password
    text = mask_text(f"cannot connect to {url}: denied for {as_parsed!r}", url)
    assert password not in text
    assert not as_parsed or as_parsed not in text
    assert host in text


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@127.0.0.1:3306/app",
        "mysql://127.0.0.1/app",
        "sqlite:///var/lib/app.db",
        "file://outbox",
        "console://",
    ],
)
def test_mask_url_without_password_is_unchanged(url: str) -> None:
    assert mask_url(url) == url
    assert mask_text(f"error at {url}", url) == f"error at {url}"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://u:pw@api.example.com:8443/K3y/v2/grants?api_key=K3y#f",
            "http://api.example.com:8443/…/grants",
        ),
        ("https://u@api.example.com/T0k3n/v1/charges", "https://api.example.com/…/charges"),
        ("https://api.example.com/grants", "https://api.example.com/grants"),
        ("https://api.example.com/?key=K3y", "https://api.example.com"),
        ("http://[::1]:8080/a/b", "http://[::1]:8080/…/b"),
        ("http://host:99x/K3y", "http://?"),
        # a webhook's secret is its last segment: a segment that is no plain name is not shown
        (
            "https://hooks.slack.com/services/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",
            "https://hooks.slack.com/…",
        ),
        (
            "https://discord.com/api/webhooks/1234567890/x7Gq-2Lk_9PwZr4TvN8mYc1Hb6DsJf3QaR5eUo0KiW",
            "https://discord.com/…",
        ),
        ("https://hooks.example.com/kQxZrLmPvTyWbNcHds", "https://hooks.example.com/…"),
        ("https://api.example.com/users/123456", "https://api.example.com/…"),
        ("https://hooks.example.com/a1b2c3d4e5", "https://hooks.example.com/…"),
        (
            "https://api.example.com/2010-04-01/Messages.json",
            "https://api.example.com/…/Messages.json",
        ),
        ("https://api.example.com/bot/sendMessage", "https://api.example.com/…/sendMessage"),
        ("https://api.example.com/v2", "https://api.example.com/v2"),
    ],
)
def test_shown_keeps_the_origin_and_the_endpoint_only(url: str, expected: str) -> None:
    assert shown(url) == expected


def test_mask_url_several_urls_in_one_text() -> None:
    text = "db mysql://a:pw1@h/x and mail smtp://b:pw2@m:25 failed"
    masked = mask_url(text)
    assert "pw1" not in masked
    assert "pw2" not in masked
    assert "mysql://a:***@h/x" in masked
    assert "smtp://b:***@m:25" in masked


def test_mask_text_removes_password_quoted_elsewhere() -> None:
    url = "mysql://root:hunter2hunter2@db/app"
    text = "login failed (password 'hunter2hunter2') for mysql://root:hunter2hunter2@db/app"
    masked = mask_text(text, None, "", url)
    assert "hunter2hunter2" not in masked
    assert "mysql://root:***@db/app" in masked


def test_mask_url_password_with_raw_at_sign() -> None:
    url = "mysql://root:pw@hunter2x@127.0.0.1:3306/app"
    assert "hunter2x" not in mask_url(url)


# -- queue messages --------------------------------------------------------------------------


def test_queue_message_round_trip() -> None:
    retry = QueueMessage("retry", "birthday", "2025-06", entity_id=42, attempt=3, reason="4xx")
    assert QueueMessage.from_json(retry.to_json(), UNITS) == retry
    cont = QueueMessage("continuation", "birthday", "2025-06", after_id=1234)
    assert QueueMessage.from_json(cont.to_json(), UNITS) == cont
    body = json.loads(cont.to_json())
    assert body["kind"] == "continuation"
    assert body["after_id"] == 1234
    assert "user_id" not in body


def test_queue_message_reason_is_truncated() -> None:
    msg = QueueMessage("retry", "birthday", "2025-06", entity_id=1, reason="x" * 5000)
    parsed = QueueMessage.from_json(msg.to_json(), UNITS)
    assert 0 < len(parsed.reason) <= 300
    assert len(msg.to_json()) < 1000


def _retry_body(**changes: Any) -> str:
    body: dict[str, Any] = {
        "v": 1,
        "kind": "retry",
        "job": "birthday",
        "month": "2025-06",
        "user_id": 42,
        "attempt": 1,
        "reason": "x",
    }
    for key, value in changes.items():
        if value is _MISSING:
            body.pop(key)
        else:
            body[key] = value
    return json.dumps(body)


_MISSING = object()


def test_queue_message_valid_body_parses() -> None:
    msg = QueueMessage.from_json(_retry_body(), UNITS)
    assert (msg.kind, msg.job, msg.period, msg.entity_id, msg.attempt) == (
        "retry",
        "birthday",
        "2025-06",
        42,
        1,
    )


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("", id="empty"),
        pytest.param("not json", id="not-json"),
        pytest.param("{'kind': 'retry'}", id="python-repr"),
        pytest.param("[1, 2, 3]", id="list"),
        pytest.param('"retry"', id="string"),
        pytest.param("null", id="null"),
        pytest.param("42", id="number"),
        pytest.param("NaN", id="nan"),
        pytest.param(_retry_body(kind="explode"), id="unknown-kind"),
        pytest.param(_retry_body(kind=_MISSING), id="missing-kind"),
        pytest.param(_retry_body(job="anniversary"), id="unknown-job"),
        pytest.param(_retry_body(job=_MISSING), id="missing-job"),
        pytest.param(_retry_body(user_id=_MISSING), id="missing-user-id"),
        pytest.param(_retry_body(user_id="42"), id="user-id-string"),
        pytest.param(_retry_body(user_id=True), id="user-id-bool"),
        pytest.param(_retry_body(user_id=-5), id="user-id-negative"),
        pytest.param(_retry_body(user_id=0), id="user-id-zero"),
        pytest.param(_retry_body(user_id=4.0), id="user-id-float"),
        pytest.param(_retry_body(user_id=None), id="user-id-null"),
        pytest.param(_retry_body(user_id=[42]), id="user-id-list"),
        pytest.param(_retry_body(attempt=-1), id="attempt-negative"),
        pytest.param(_retry_body(attempt="1"), id="attempt-string"),
        pytest.param(_retry_body(month="2025-13"), id="month-13"),
        pytest.param(_retry_body(month="2025-6-1"), id="month-with-day"),
        pytest.param(_retry_body(month=202506), id="month-int"),
        pytest.param(_retry_body(month=_MISSING), id="month-missing"),
        pytest.param(
            json.dumps({"kind": "continuation", "job": "birthday", "month": "2025-06"}),
            id="continuation-no-after-id",
        ),
        pytest.param(
            json.dumps(
                {"kind": "continuation", "job": "birthday", "month": "2025-06", "after_id": -1}
            ),
            id="continuation-negative-after-id",
        ),
        pytest.param(_retry_body(reason="x" * (MAX_BODY + 1)), id="huge-body"),
        pytest.param("[" * 100_000, id="deeply-nested"),
    ],
)
def test_queue_message_poison(body: str) -> None:
    with pytest.raises(PoisonMessage):
        QueueMessage.from_json(body, UNITS)


def test_poison_message_is_a_value_error_with_reason() -> None:
    with pytest.raises(ValueError, match="bad id"):
        QueueMessage.from_json(_retry_body(user_id="42"), UNITS)


def test_queue_message_user_id_out_of_range_is_poison() -> None:
    with pytest.raises(PoisonMessage):
        QueueMessage.from_json(_retry_body(user_id=2**64), UNITS)


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_ceiling_grows_exponentially_then_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_base.random, "uniform", lambda low, high: high)
    ceilings = [backoff_s(n, base_s=2.0, max_s=100.0) for n in range(1, 10)]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 100.0, 100.0]
    assert backoff_s(0, base_s=2.0, max_s=100.0) == 2.0
    assert backoff_s(1000, base_s=30.0, max_s=3600.0) == 3600.0  # no overflow for big counts


def test_backoff_jitter_in_upper_half_of_ceiling() -> None:
    for n in range(1, 12):
        ceiling = min(3600.0, 30.0 * 2 ** (n - 1))
        samples = [backoff_s(n, base_s=30.0, max_s=3600.0) for _ in range(300)]
        assert all(0.5 * ceiling <= s <= ceiling for s in samples), (n, min(samples))
        assert len(set(samples)) > 200  # jittered, not a constant
        assert min(samples) < 0.6 * ceiling
        assert max(samples) > 0.9 * ceiling


def test_backoff_zero_base_is_zero() -> None:
    assert backoff_s(3, base_s=0.0, max_s=100.0) == 0.0


# -- the SQL loader --------------------------------------------------------------------------

SQL = """
-- name: by_ids
SELECT id FROM user WHERE id IN :ids* AND status = :status;

-- name: insert_rows
INSERT INTO t (a, b, c) VALUES :rows*;

-- name: percent
SELECT id FROM t WHERE name LIKE 'a%' AND id % 2 = :odd;

-- name: quoted
SELECT ':nope', "col:umn", `x:y`, 'it''s :also_not', '12:30' FROM t
WHERE a = :a -- a comment with :not_a_param
  AND b = :b;

-- name: repeated
SELECT :x, :y, :x;

-- name: cast
SELECT a::int FROM t WHERE b = :b;

-- name: guarded
-- unless: column user.birth_month
-- unless: index user.idx
ALTER TABLE user ADD COLUMN x INT;
"""


def _queries(dialect: str) -> Queries:
    return Queries(
        dialect=dialect, placeholder="%s" if dialect == "mysql" else "?", statements=parse(SQL)
    )


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_compile_expands_id_list(dialect: str) -> None:
    q = _queries(dialect)
    mark = q.placeholder
    sql, args = q.compile("by_ids", {"ids": [5, 6, 7], "status": 10})
    assert sql == f"SELECT id FROM user WHERE id IN ({mark}, {mark}, {mark}) AND status = {mark}"
    assert args == (5, 6, 7, 10)
    # The cache is keyed by the list's length: a shorter list gets fewer placeholders.
    sql, args = q.compile("by_ids", {"ids": [9], "status": 0})
    assert sql == f"SELECT id FROM user WHERE id IN ({mark}) AND status = {mark}"
    assert args == (9, 0)
    sql, args = q.compile("by_ids", {"ids": list(range(40)), "status": 1})
    assert sql.count(mark) == 41
    assert args == (*range(40), 1)


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_compile_expands_row_tuples(dialect: str) -> None:
    q = _queries(dialect)
    mark = q.placeholder
    row = f"({mark}, {mark}, {mark})"
    sql, args = q.compile("insert_rows", {"rows": [(1, "a", None), (2, "b", 3.5)]})
    assert sql == f"INSERT INTO t (a, b, c) VALUES {row}, {row}"
    assert args == (1, "a", None, 2, "b", 3.5)
    sql, args = q.compile("insert_rows", {"rows": [(1, 2, 3)] * 3})
    assert sql == f"INSERT INTO t (a, b, c) VALUES {row}, {row}, {row}"
    assert args == (1, 2, 3) * 3
    sql, args = q.compile("insert_rows", {"rows": [(1, 2)]})
    assert sql == f"INSERT INTO t (a, b, c) VALUES ({mark}, {mark})"


def test_compile_doubles_literal_percent_for_mysql_only() -> None:
    sql, args = _queries("mysql").compile("percent", {"odd": 1})
    assert sql == "SELECT id FROM t WHERE name LIKE 'a%%' AND id %% 2 = %s"
    assert args == (1,)
    assert sql % tuple("?" for _ in args) == "SELECT id FROM t WHERE name LIKE 'a%' AND id % 2 = ?"
    sql, _ = _queries("sqlite").compile("percent", {"odd": 1})
    assert sql == "SELECT id FROM t WHERE name LIKE 'a%' AND id % 2 = ?"


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_compile_leaves_colons_in_quotes_and_comments(dialect: str) -> None:
    q = _queries(dialect)
    mark = q.placeholder
    sql, args = q.compile("quoted", {"a": 1, "b": 2})
    assert "':nope', \"col:umn\", `x:y`, 'it''s :also_not', '12:30'" in sql
    assert ":not_a_param" in sql
    assert sql.endswith(f"AND b = {mark}")
    assert f"a = {mark}" in sql
    assert args == (1, 2)
    sql, args = q.compile("cast", {"b": 3})
    assert "a::int" in sql
    assert args == (3,)


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_compile_repeated_parameter(dialect: str) -> None:
    q = _queries(dialect)
    sql, args = q.compile("repeated", {"x": "X", "y": "Y"})
    mark = q.placeholder
    assert sql == f"SELECT {mark}, {mark}, {mark}"
    assert args == ("X", "Y", "X")


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_compile_missing_parameter_raises(dialect: str) -> None:
    q = _queries(dialect)
    with pytest.raises(KeyError, match="status"):
        q.compile("by_ids", {"ids": [1]})
    with pytest.raises(KeyError):
        q.compile("no_such_query", {})


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
@pytest.mark.parametrize("empty", [[], (), None, 5])
def test_compile_empty_or_non_list_expansion_raises(dialect: str, empty: Any) -> None:
    q = _queries(dialect)
    with pytest.raises(ValueError, match="ids"):
        q.compile("by_ids", {"ids": empty, "status": 10})
    with pytest.raises(ValueError, match="rows"):
        q.compile("insert_rows", {"rows": []})


def test_parse_reads_guards_and_strips_comments() -> None:
    statements = parse(SQL)
    guarded = statements["guarded"]
    assert guarded.unless == ("column user.birth_month", "index user.idx")
    assert guarded.text == "ALTER TABLE user ADD COLUMN x INT"
    assert not statements["by_ids"].text.endswith(";")


def test_parse_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_shipped_queries_load_and_compile(dialect: str) -> None:
    queries = load(dialect)
    assert queries.placeholder == ("%s" if dialect == "mysql" else "?")
    for name in ("claims_of", "claim_new", "finish", "status_counts", "queue_send"):
        assert name in queries.statements
    steps = migration_steps(dialect)
    names = [s.name for s in steps]
    assert names == sorted(names)
    assert names[0].startswith("migrate_0000")
    sql, args = queries.compile("claims_of", {"job": "birthday", "once": "2025", "ids": [4, 5, 6]})
    assert args == ("birthday", "2025", 4, 5, 6)  # a list parameter expands for IN
    assert ":" not in re.sub(r"'[^']*'", "", sql)
    birthday = Birthday.sql
    assert birthday is not None
    page = birthday.text(dialect, "page")
    sql, args = queries.compile_text(page, page, {"month": 6, "after": 0, "limit": 10})
    assert args == (6, 0, 10) and ":" not in sql
    assert next(s.name for s in birthday.migration_steps(dialect)) == "migrate_0001_user"


def test_parse_month_accepts_a_one_digit_month() -> None:
    assert str(parse_month("2025-6")) == "2025-06"
    assert str(parse_month(" 2025-12 ")) == "2025-12"


# -- settings --------------------------------------------------------------------------------


def test_settings_defaults_from_empty_mapping() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.db_url, s.mail_url, s.retry_queue_url, s.sender) == (
        DEFAULT_DB,
        DEFAULT_MAIL,
        None,
        None,  # no --from: each job's own (the birthday job's is Birthday.sender)
    )
    assert s.sender_for(Birthday()) == "birthday@localhost"
    assert s.lease_s <= 15.0  # the contract: a dead run's claims expire within 15 s
    assert s.max_receives == 5
    assert s.deadline_margin_ms is None
    assert dict(s.extra) == {}


def test_settings_from_env_overrides() -> None:
    env = {
        "BATCHRUN_DB": "mysql://u:p@h/db",
        "BATCHRUN_MAIL": "smtp://localhost:2525",
        "BATCHRUN_RETRY_QUEUE": "https://sqs.eu-west-1.amazonaws.com/1/q",
        "BATCHRUN_FROM": "gifts@example.com",
        "BATCHRUN_MAIL_TIMEOUT_S": "2.5",
        "BATCHRUN_LEASE_S": "3",
        "BATCHRUN_BREAKER_THRESHOLD": "7",
        "BATCHRUN_MAX_RECEIVES": "9",
        "BATCHRUN_RETRY_BASE_S": "0",
        "BATCHRUN_RETRY_MAX_BACKOFF_S": "60",
        "BATCHRUN_CARD_MESSAGE": "Many happy returns",
        "BATCHRUN_DEADLINE_MARGIN_MS": "750",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:5000",
        "HOME": "/root",
    }
    s = Settings.from_env(env)
    assert s.db_url == "mysql://u:p@h/db"
    assert s.mail_url == "smtp://localhost:2525"
    assert s.retry_queue_url == "https://sqs.eu-west-1.amazonaws.com/1/q"
    assert s.sender == "gifts@example.com"
    assert s.mail_timeout_s == 2.5
    assert s.lease_s == 3.0
    assert s.breaker_threshold == 7
    assert s.max_receives == 9
    assert s.retry_base_s == 0.0
    assert s.retry_max_backoff_s == 60.0
    assert s.environ["BATCHRUN_CARD_MESSAGE"] == "Many happy returns"  # the birthday job's
    assert s.deadline_margin_ms == 750
    assert dict(s.extra) == {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:5000"}


def test_settings_empty_values_mean_default() -> None:
    s = Settings.from_env({"BATCHRUN_DB": "", "BATCHRUN_LEASE_S": "", "BATCHRUN_RETRY_QUEUE": ""})
    assert s.db_url == DEFAULT_DB
    assert s.lease_s == Settings().lease_s
    assert s.retry_queue_url is None


def test_settings_with_overrides_ignores_none() -> None:
    base = Settings.from_env({"BATCHRUN_DB": "sqlite:///a.db", "BATCHRUN_FROM": "a@b.c"})
    s = base.with_overrides(db_url="sqlite:///b.db", mail_url=None, sender=None)
    assert s.db_url == "sqlite:///b.db"
    assert s.sender == "a@b.c"
    assert s.mail_url == DEFAULT_MAIL
    assert base.db_url == "sqlite:///a.db"  # frozen: the original is unchanged


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("BATCHRUN_LEASE_S", "abc"),
        ("BATCHRUN_LEASE_S", "0.1"),  # below the minimum
        ("BATCHRUN_MAIL_TIMEOUT_S", "ten"),
        ("BATCHRUN_MAIL_TIMEOUT_S", "-1"),
        ("BATCHRUN_MAX_RECEIVES", "0"),
        ("BATCHRUN_MAX_RECEIVES", "five"),
        ("BATCHRUN_BREAKER_THRESHOLD", "0"),
        ("BATCHRUN_RETRY_BASE_S", "-3"),
        ("BATCHRUN_DEADLINE_MARGIN_MS", "soon"),
        ("BATCHRUN_RETRY_MAX_BACKOFF_S", "1h"),
    ],
)
def test_settings_bad_number_is_config_error(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({key: value})
    assert key in str(info.value)
    assert ConfigError.exit_code == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("BATCHRUN_MAX_RECEIVES", "nan"),
        ("BATCHRUN_BREAKER_THRESHOLD", "inf"),
        ("BATCHRUN_LEASE_S", "nan"),
        ("BATCHRUN_MAIL_TIMEOUT_S", "inf"),
    ],
)
def test_settings_non_finite_number_is_config_error(key: str, value: str) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({key: value})


# -- the database secret ------------------------------------------------------------------


def test_a_database_secret_may_be_a_url_or_json() -> None:
    from batchrun.aws_secrets import url_from_secret

    assert url_from_secret(" mysql://u:p@h:3306/d \n") == "mysql://u:p@h:3306/d"
    assert url_from_secret('{"url": "sqlite:///x.db"}') == "sqlite:///x.db"
    rds = '{"username": "app", "password": "p@ss:/w", "host": "db", "dbname": "shop"}'
    assert url_from_secret(rds) == "mysql://app:p%40ss%3A%2Fw@db:3306/shop"
    # RDS's own PostgreSQL secret names its engine: it was read as MySQL on port 3306.
    pg = '{"username": "u", "password": "pw", "host": "db", "dbname": "app", "engine": "postgres"}'
    assert url_from_secret(pg) == "postgresql://u:pw@db:5432/app"
    aurora = pg.replace('"postgres"', '"aurora-mysql"').replace('"app"', '"app", "port": 3307')
    assert url_from_secret(aurora) == "mysql://u:pw@db:3307/app"
    with pytest.raises(ConfigError, match="engine 'oracle-ee' is not one"):
        url_from_secret(pg.replace('"postgres"', '"oracle-ee"'))
    for bad in ('{"username": "x"}', "[1]", "{not json"):
        with pytest.raises(ConfigError):
            url_from_secret(bad)


# -- an error's causes ---------------------------------------------------------------------


def test_causes_follow_os_error_before_cause_and_end_on_a_loop() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    wrapper = OSError("cannot connect")
    wrapper.os_error = refused  # type: ignore[attr-defined]  # as aiohttp's connector errors
    wrapper.__cause__ = ValueError("not followed: os_error comes first")
    outer = RuntimeError("send failed")
    outer.__cause__ = wrapper
    assert list(causes(outer)) == [outer, wrapper, refused]
    assert list(causes(None)) == []
    looped = ValueError("a")
    other = ValueError("b")
    looped.__cause__, other.__cause__ = other, looped
    assert list(causes(looped, limit=5)) == [looped, other, looped, other, looped]


def test_mask_text_never_raises_and_split_says_which_url() -> None:
    url = "mysql://u:Hunter3Secret@[::1/app"
    assert mask_text(f"cannot connect: Hunter3Secret at {url}", url) == (
        "cannot connect: *** at mysql://u:***@[::1/app"
    )
    with pytest.raises(ConfigError, match=r"unusable URL 'mysql://u:\*\*\*@\[::1'") as caught:
        split(url)
    assert "Hunter3Secret" not in str(caught.value)
    # A backend's path and query may hold a key: neither is shown.
    with pytest.raises(ConfigError) as caught:
        split("https://[bad]/v1?api_key=sk_live_SECRET")
    assert "sk_live_SECRET" not in str(caught.value) and "'https://[bad]'" in str(caught.value)


def test_a_statement_timeout_is_told_from_a_cancel_someone_asked_for() -> None:
    """Both are 57014 on PostgreSQL: only the database's time limit goes again as a lock
    wait does; a DBA's ``pg_cancel_backend`` is not retried behind their back."""
    import asyncpg

    from batchrun.db.postgresql import _timed_out

    canceled = asyncpg.exceptions.QueryCanceledError
    assert _timed_out(canceled("canceling statement due to statement timeout"))
    assert not _timed_out(canceled("canceling statement due to user request"))
    assert not _timed_out(asyncpg.exceptions.LockNotAvailableError("lock timeout"))


def test_task_data_is_measured_as_utf8_json() -> None:
    """Stored escaped (``\\u00e9``: 6 bytes a letter), the data was measured so: 90,000
    accented letters, 180 KB of UTF-8, were refused as over 200 KB."""
    from batchrun.task import MAX_DATA, BadTask, checked

    _, text, _ = checked(1, {"text": "\u00e9" * 90_000}, "k")
    assert len(text) > MAX_DATA and text.isascii()  # stored escaped, measured unescaped
    with pytest.raises(BadTask, match=r"over 200 KB \(240008 bytes\)"):
        checked(1, {"t": "\U0001f600" * 60_000}, "k")  # 4 bytes each in UTF-8
    checked(1, {"t": "\ud800" * 10}, "k")  # a lone surrogate still goes


def test_a_page_filtered_by_its_id_range_alone_reads_by_id_and_is_not_slow() -> None:
    """`db explain` called every page read by the primary key slow, the scaffold's own
    (`WHERE id > :after`) too: with no other filter, no index could do better."""
    from batchrun.cli.explain import page_verdict

    pk = [{"detail": "SEARCH customers USING INTEGER PRIMARY KEY (rowid>?)"}]
    alone = (
        "SELECT customer_id AS id FROM customers WHERE customer_id > ? ORDER BY customer_id LIMIT ?"
    )
    line = page_verdict("digest", "sqlite", [(alone, pk)], 500)
    assert line.startswith("ok: digest's page query reads customers by id (its only filter)")
    filtered = "SELECT id FROM customers WHERE plan = 'trial' AND id > ? ORDER BY id LIMIT ?"
    assert page_verdict("t", "sqlite", [(filtered, pk)], 500).startswith("slow: ")
    mysql = [{"table": "account", "key": "PRIMARY", "type": "range", "Extra": "Using where"}]
    assert page_verdict(
        "t", "mysql", [("SELECT id FROM account WHERE id > %s ORDER BY id LIMIT %s", mysql)], 500
    ).startswith("ok: ")
    assert page_verdict(
        "t",
        "mysql",
        [("SELECT id FROM account WHERE active = 1 AND id > %s ORDER BY id LIMIT %s", mysql)],
        500,
    ).startswith("slow: ")

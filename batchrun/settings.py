"""Settings: one frozen dataclass read from an injectable mapping; nothing else reads os.environ."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from batchrun.errors import ConfigError
from batchrun.urls import split

if TYPE_CHECKING:
    from batchrun.job import Job

DEFAULT_DB = "sqlite:///batchrun.db"
DEFAULT_MAIL = "file://outbox"


# The largest number any setting takes (seconds, counts): 1e9 s (31 years) is more than any
# lease, timeout or backoff needs, and keeps every millisecond sum within a 64-bit integer.
MAX_SECONDS = 1e9


def _float(
    env: Mapping[str, str],
    key: str,
    default: float,
    *,
    minimum: float = 0.0,
    maximum: float = MAX_SECONDS,
) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise ConfigError(f"{key} must be a finite number of at least {minimum:g}, got {raw!r}")
    if value > maximum:
        raise ConfigError(f"{key} must be at most {maximum:,g}, got {raw[:40]!r}")
    return value


def parse_rate(text: str, what: str = "--rate") -> float | Literal["auto"]:
    """A rate: a positive number per second (emails, calls), or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} must be a number per second or 'auto', got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a positive number or 'auto', got {text!r}")
    return value


EVENT_LOOPS = ("auto", "asyncio", "uvloop")  # BATCHRUN_EVENT_LOOP (runtime/event_loop.py)


def event_loop_choice(text: str) -> str:
    """``text`` as a BATCHRUN_EVENT_LOOP choice, or ConfigError with the one line."""
    choice = text.strip().lower()
    if choice not in EVENT_LOOPS:
        raise ConfigError(
            f"BATCHRUN_EVENT_LOOP must be auto, asyncio or uvloop, got {choice[:40]!r}"
        )
    return choice


def _int(
    env: Mapping[str, str],
    key: str,
    default: int,
    *,
    minimum: int = 0,
    maximum: float = MAX_SECONDS,
) -> int:
    return int(_float(env, key, default, minimum=minimum, maximum=maximum))


# Entities worked on at once, at most: each is a task (and, for mail, a connection's worth of
# the pool); a million of them took 1.6 GB before the first entity, 10**20 the machine.
MAX_CONCURRENCY = 10_000


MIN_SECRET_CHARS = 16
MAX_UNSUBSCRIBE_URL_CHARS = 300  # List-Unsubscribe must stay on one line of at most 998


def _unsubscribe(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """BATCHRUN_UNSUBSCRIBE_URL and BATCHRUN_UNSUBSCRIBE_SECRET: both, or neither."""
    url = env.get("BATCHRUN_UNSUBSCRIBE_URL") or None
    secret = env.get("BATCHRUN_UNSUBSCRIBE_SECRET") or None
    if (url is None) != (secret is None):
        missing = "BATCHRUN_UNSUBSCRIBE_SECRET" if secret is None else "BATCHRUN_UNSUBSCRIBE_URL"
        raise ConfigError(f"one-click unsubscribe needs {missing} too (set both, or neither)")
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        # The message never holds the secret itself.
        raise ConfigError(
            f"BATCHRUN_UNSUBSCRIBE_SECRET must be at least {MIN_SECRET_CHARS} characters "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
        )
    if url is not None:
        try:
            parts = urlsplit(url)
        except ValueError:
            parts = urlsplit("")
        if (
            parts.scheme not in ("https", "http")
            or not parts.netloc
            or parts.query
            or parts.fragment
            or not url.isascii()
            or any(c.isspace() or ord(c) < 32 or c in '<>"' for c in url)
            or len(url) > MAX_UNSUBSCRIBE_URL_CHARS
        ):
            raise ConfigError(
                f"BATCHRUN_UNSUBSCRIBE_URL must be an https:// base URL (no query, at most "
                f"{MAX_UNSUBSCRIBE_URL_CHARS} characters) that tokens go under, got {url[:80]!r}"
            )
    return url, secret


# A DKIM selector is one or more DNS labels: SELECTOR._domainkey.DOMAIN must be a name.
_SELECTOR = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*")


def _dkim(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """BATCHRUN_DKIM_KEY_FILE and BATCHRUN_DKIM_SELECTOR: both, or neither."""
    key_file = env.get("BATCHRUN_DKIM_KEY_FILE") or None
    selector = env.get("BATCHRUN_DKIM_SELECTOR") or None
    if (key_file is None) != (selector is None):
        missing = "BATCHRUN_DKIM_SELECTOR" if selector is None else "BATCHRUN_DKIM_KEY_FILE"
        raise ConfigError(f"DKIM signing needs {missing} too (set both, or neither)")
    if selector is not None and (len(selector) > 200 or not _SELECTOR.fullmatch(selector)):
        raise ConfigError(
            f"BATCHRUN_DKIM_SELECTOR must be a DNS label such as 'mail2026', got {selector[:80]!r}"
        )
    return key_file, selector


@dataclass(frozen=True, slots=True)
class BackendEnv:
    """A backend's figures from the environment; None where the variable is unset."""

    url: str | None = None  # BATCHRUN_BACKEND_<NAME>_URL: ctx.http's base URL
    rate: float | Literal["auto"] | None = None  # _RATE: in place of Backend.rate
    concurrency: int | None = None  # _CONCURRENCY: in place of Backend.concurrency
    timeout_s: float | None = None  # _TIMEOUT_S: ctx.http's timeout (default 10 s)


def backend_env(env: Mapping[str, str], name: str) -> BackendEnv:
    """``BATCHRUN_BACKEND_<NAME>_URL``, ``_RATE``, ``_CONCURRENCY`` and ``_TIMEOUT_S`` of
    backend ``name`` (upper case, ``-`` as ``_``).

    Raises:
        ConfigError: a variable that is set but unusable, naming it.
    """
    prefix = f"BATCHRUN_BACKEND_{name.upper().replace('-', '_')}_"
    url = env.get(prefix + "URL") or None
    if url is not None:
        parts = split(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            got = f"a {parts.scheme}:// one" if parts.scheme else "one without a scheme"
            raise ConfigError(f"{prefix}URL must be an http(s):// URL, got {got}")
    rate = env.get(prefix + "RATE")
    concurrency = env.get(prefix + "CONCURRENCY")
    timeout = env.get(prefix + "TIMEOUT_S")
    return BackendEnv(
        url=url,
        rate=parse_rate(rate, prefix + "RATE") if rate else None,
        concurrency=(
            _int(env, prefix + "CONCURRENCY", 1, minimum=1, maximum=MAX_CONCURRENCY)
            if concurrency
            else None
        ),
        timeout_s=_float(env, prefix + "TIMEOUT_S", 10.0, minimum=0.001) if timeout else None,
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything configurable; CLI options override the environment through ``replace``."""

    db_url: str = DEFAULT_DB
    mail_url: str = DEFAULT_MAIL
    retry_queue_url: str | None = None  # None: the queue table in the --db database
    sender: str | None = None  # --from; None: each job's own (Job.sender, "{job}@localhost")
    # BATCHRUN_BRAND: the name templates show as ``brand`` (greeting, signature, footer);
    # None: the display name of the From ("Acme Gifts <gifts@acme.example>")
    brand: str | None = None
    mail_timeout_s: float = 10.0
    lease_s: float = 15.0  # a dead run's claims expire this long after its last heartbeat
    breaker_threshold: int = 5  # consecutive connection-level mail failures that stop a run
    bug_threshold: int = 10  # entities in a row failing with one non-transient error: stop
    max_receives: int = 5  # deliveries of a retry message before it is dead-lettered
    retry_base_s: float = 30.0  # first backoff of a retry that failed again; doubles each time
    retry_max_backoff_s: float = 3600.0
    deadline_margin_ms: int | None = None
    db_secret_arn: str | None = None  # the Lambda's: --db from Secrets Manager, if no --db
    concurrency: int = 20  # the Lambda's; the CLI takes --concurrency
    rate: float | Literal["auto"] | None = None  # the Lambda's; the CLI takes --rate
    max_db_load: int | None = None  # pause pages while Threads_running is above (MySQL)
    # how long a consumer's entity waits in-process for a busy backend before it goes back
    # to the queue (a run waits until the backend is free, or it stops)
    busy_wait_s: float = 30.0
    # a submitted task still not started this long after its submission looks lost (its
    # submitter died before sending the message): its message is sent again
    task_resend_s: float = 300.0
    extra: Mapping[str, str] = field(default_factory=dict)
    scheduled_jobs: str | None = None  # the Lambda's: the jobs a scheduled event runs
    jobs: str | None = None  # --jobs: modules or .py files defining jobs, comma-separated
    # BATCHRUN_BUILTIN_JOBS: the built-in jobs to register, comma-separated ("" for none);
    # None (unset): all of them.
    builtin_jobs: str | None = None
    templates_dir: str | None = None  # --templates: email templates overriding the jobs' own
    # One-click unsubscribe: the base URL tokens go under, and the secret that signs them.
    unsubscribe_url: str | None = None
    unsubscribe_secret: str | None = field(default=None, repr=False)
    # DKIM for SMTP relays that do not sign (never on SES): the PEM key file and selector.
    dkim_key_file: str | None = None
    dkim_selector: str | None = None
    # BATCHRUN_EVENT_LOOP: auto (uvloop when installed), asyncio or uvloop (event_loop.py)
    event_loop: str = "auto"
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)  # jobs read it: ctx.env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``environ`` (``os.environ`` when None)."""
        env = os.environ if environ is None else environ
        margin = env.get("BATCHRUN_DEADLINE_MARGIN_MS")
        rate = env.get("BATCHRUN_RATE")
        unsubscribe_url, unsubscribe_secret = _unsubscribe(env)
        dkim_key_file, dkim_selector = _dkim(env)
        return cls(
            db_url=env.get("BATCHRUN_DB") or DEFAULT_DB,
            mail_url=env.get("BATCHRUN_MAIL") or DEFAULT_MAIL,
            retry_queue_url=env.get("BATCHRUN_RETRY_QUEUE") or None,
            sender=env.get("BATCHRUN_FROM") or None,
            brand=(env.get("BATCHRUN_BRAND") or "").strip() or None,
            mail_timeout_s=_float(env, "BATCHRUN_MAIL_TIMEOUT_S", 10.0, minimum=0.1),
            lease_s=_float(env, "BATCHRUN_LEASE_S", 15.0, minimum=0.5),
            breaker_threshold=_int(env, "BATCHRUN_BREAKER_THRESHOLD", 5, minimum=1),
            bug_threshold=_int(env, "BATCHRUN_BUG_THRESHOLD", 10, minimum=1),
            max_receives=_int(env, "BATCHRUN_MAX_RECEIVES", 5, minimum=1),
            retry_base_s=_float(env, "BATCHRUN_RETRY_BASE_S", 30.0),
            retry_max_backoff_s=_float(env, "BATCHRUN_RETRY_MAX_BACKOFF_S", 3600.0),
            deadline_margin_ms=_int(env, "BATCHRUN_DEADLINE_MARGIN_MS", 0) if margin else None,
            db_secret_arn=None if env.get("BATCHRUN_DB") else env.get("BATCHRUN_DB_SECRET_ARN"),
            concurrency=_int(env, "BATCHRUN_CONCURRENCY", 20, minimum=1, maximum=MAX_CONCURRENCY),
            rate=parse_rate(rate, "BATCHRUN_RATE") if rate else None,
            busy_wait_s=_float(env, "BATCHRUN_BUSY_WAIT_S", 30.0),
            task_resend_s=_float(env, "BATCHRUN_TASK_RESEND_S", 300.0, minimum=1.0),
            max_db_load=(
                _int(env, "BATCHRUN_MAX_DB_LOAD", 0, minimum=1)
                if env.get("BATCHRUN_MAX_DB_LOAD")
                else None
            ),
            extra={k: v for k, v in env.items() if k.startswith("AWS_")},
            jobs=env.get("BATCHRUN_JOBS") or None,
            builtin_jobs=env.get("BATCHRUN_BUILTIN_JOBS"),  # set but empty: none
            scheduled_jobs=env.get("BATCHRUN_SCHEDULED_JOBS") or None,
            templates_dir=env.get("BATCHRUN_TEMPLATES") or None,
            unsubscribe_url=unsubscribe_url,
            unsubscribe_secret=unsubscribe_secret,
            dkim_key_file=dkim_key_file,
            dkim_selector=dkim_selector,
            event_loop=event_loop_choice(env.get("BATCHRUN_EVENT_LOOP") or "auto"),
            environ=dict(env),
        )

    def backend(self, name: str) -> BackendEnv:
        """The deployment's figures for backend ``name`` (``BATCHRUN_BACKEND_<NAME>_*``).

        Raises:
            ConfigError: a variable that is set but unusable, naming it.
        """
        return backend_env(self.environ, name)

    def sender_for(self, job: Job) -> str:
        """The From of ``job``'s emails: ``--from`` (``BATCHRUN_FROM``), else the job's own."""
        return self.sender or job.sender_address()

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with the non-None ``changes`` applied (CLI options)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

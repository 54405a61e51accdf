"""SesMailer against moto's server through the real aioboto3 client."""

from __future__ import annotations

import base64
import email
import email.policy
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aioboto3
import pytest
from support.aws_server import HOST, MotoServer, answer_with, moto_raw_messages

from batchrun.errors import (
    ConfigError,
    MailConnectionError,
    MailError,
    PermanentMailError,
    SendingStoppedError,
    TemporaryMailError,
    ThrottledError,
)
from batchrun.mail.base import Message, from_url
from batchrun.mail.ses import SesMailer

SENDER = "birthday@example.com"
# Distinctive dummy keys (moto takes any), so a leak into an error text would show.
ACCESS_KEY = "AKIASESTESTKEY0000001"
SECRET = "ses-test-SECRET-wJalrXUtnFEMI-K7MDENG"


@pytest.fixture
def ses_env(aws_env: dict[str, str]) -> dict[str, str]:
    """The shared AWS environment with this module's credentials."""
    return {**aws_env, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET}


@pytest.fixture
async def verified(ses_env: dict[str, str]) -> str:
    """Verify SENDER in moto (sesv2 CreateEmailIdentity), as SES requires before sending."""
    session = aioboto3.Session(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    async with session.client("sesv2", endpoint_url=ses_env["AWS_ENDPOINT_URL"]) as client:
        await client.create_email_identity(EmailIdentity=SENDER)
    return SENDER


@pytest.fixture
async def make_mailer(ses_env: dict[str, str]) -> AsyncIterator[Callable[..., SesMailer]]:
    """Factory of SesMailers on moto, closed at teardown."""
    mailers: list[SesMailer] = []

    def make(**overrides: Any) -> SesMailer:
        overrides.setdefault("env", ses_env)
        overrides.setdefault("timeout", 5.0)
        mailer = SesMailer(overrides.pop("region", "us-east-1"), **overrides)
        mailers.append(mailer)
        return mailer

    yield make
    for mailer in mailers:
        await mailer.close()


def message(user_id: int = 42, to_addr: str = "ada@example.org") -> Message:
    return Message(
        sender=f"Birthday Team <{SENDER}>",
        to_addr=to_addr,
        to_name="Ada Lovelace",
        subject="Happy birthday! A gift card for you",
        text="Happy birthday, Ada!\n\nHere is a gift card: ABCD-EFGH-JKMN-PQRS\n",
        html="<p>Happy birthday, Ada! Joyeux anniversaire, Zoë</p>",
        message_id=f"<birthday.2025.{user_id}@example.com>",
    )


def canonical(raw: bytes) -> bytes:
    """``raw`` without its Date header and with a fixed MIME boundary."""
    boundary = email.message_from_bytes(raw).get_boundary()
    assert boundary
    lines = raw.replace(boundary.encode(), b"BOUNDARY").split(b"\r\n")
    return b"\r\n".join(line for line in lines if not line.startswith(b"Date: "))


# -- sending ------------------------------------------------------------------------------


async def test_a_message_is_accepted_and_moto_holds_the_same_bytes(
    moto_server: MotoServer, verified: str, make_mailer: Callable[..., SesMailer]
) -> None:
    mailer = make_mailer()
    with pytest.raises(RuntimeError):
        _ = mailer.client  # created lazily, on the first send
    sent: list[bytes] = []

    def capture(request: Any, **_: Any) -> None:
        sent.append(base64.b64decode(json.loads(request.body)["Content"]["Raw"]["Data"]))

    await mailer.open()
    mailer.client.meta.events.register("before-send.sesv2.SendEmail", capture)
    msg = message()
    await mailer.send(msg)

    (held,) = moto_raw_messages(moto_server)
    assert held["source"] == SENDER  # the bare envelope address, not "Name <addr>"
    assert "ada@example.org" in held["destinations"]
    assert held["raw_data"].encode() == sent[0]  # moto got exactly what we sent
    parsed = email.message_from_bytes(sent[0], policy=email.policy.default)
    assert parsed["Message-ID"] == "<birthday.2025.42@example.com>"
    # The very bytes the SMTP and file backends send: Message.to_bytes(), equal but for
    # what each call makes afresh (the Date header and the MIME boundary).
    assert canonical(sent[0]) == canonical(msg.to_bytes())


async def test_an_unverified_sender_stops_the_run_rather_than_failing_the_user(
    ses_env: dict[str, str], make_mailer: Callable[..., SesMailer]
) -> None:
    # moto, like SES, refuses a sender identity that was never verified (MessageRejected
    # naming the sender): every message would fail alike, so it is connection-level.
    with pytest.raises(MailConnectionError) as info:
        await make_mailer().send(message())
    assert "sender refused" in info.value.reason
    assert SENDER in info.value.reason


@pytest.mark.parametrize(
    ("status", "code", "text"),
    [
        (429, "TooManyRequestsException", "Maximum sending rate exceeded."),
        (400, "ThrottlingException", "Rate exceeded"),
        (400, "LimitExceededException", "Maximum sending rate exceeded."),
        (429, None, "Too Many Requests"),
    ],
)
async def test_throttling_is_a_throttled_error_and_the_resend_goes_through(
    moto_server: MotoServer,
    verified: str,
    make_mailer: Callable[..., SesMailer],
    status: int,
    code: str | None,
    text: str,
) -> None:
    mailer = make_mailer()
    await mailer.open()
    handler = answer_with(status, code, {"message": text}, times=1)
    mailer.client.meta.events.register("before-send.sesv2.SendEmail", handler)
    with pytest.raises(ThrottledError) as info:
        await mailer.send(message())
    assert isinstance(info.value, TemporaryMailError)
    assert not isinstance(info.value, MailConnectionError)  # never trips the breaker
    assert text in info.value.reason
    assert info.value.retry_after_s is None
    assert moto_raw_messages(moto_server) == []  # botocore did not retry it by itself
    await mailer.send(message())  # the job resends; the provider takes it now
    assert len(moto_raw_messages(moto_server)) == 1


async def test_a_retry_after_header_is_carried(
    verified: str, make_mailer: Callable[..., SesMailer]
) -> None:
    mailer = make_mailer()
    await mailer.open()
    handler = answer_with(
        429, "TooManyRequestsException", {"message": "slow down"}, headers={"Retry-After": "2"}
    )
    mailer.client.meta.events.register("before-send.sesv2.SendEmail", handler)
    with pytest.raises(ThrottledError) as info:
        await mailer.send(message())
    assert info.value.retry_after_s == 2.0


@pytest.mark.parametrize(
    ("status", "code", "text", "kind"),
    [
        # this message or recipient: recorded with the reason, never retried
        (400, "MessageRejected", "Email address is not verified: ada@example.org", "permanent"),
        (400, "BadRequestException", "Illegal address", "permanent"),
        # nothing passes until someone acts on the account: the run stops at once
        (400, "AccountSuspendedException", "Account suspended", "stop"),
        (400, "SendingPausedException", "Sending paused for this account", "stop"),
        # the account or its setup: every user would fail alike -> the circuit breaker
        (400, "MailFromDomainNotVerifiedException", "MAIL FROM not verified", "connection"),
        (404, "NotFoundException", "Configuration set does not exist", "connection"),
        (403, "UnrecognizedClientException", "The security token is invalid", "connection"),
        (400, "Throttling", "Daily message quota exceeded.", "connection"),
        # SES itself failing
        (500, "InternalFailure", "Internal failure", "connection"),
        (503, "ServiceUnavailable", "Service unavailable", "connection"),
        # unknown: retried later, nothing lost
        (400, "SomethingNewException", "New failure", "temporary"),
    ],
)
async def test_error_replies_are_classified(
    verified: str,
    make_mailer: Callable[..., SesMailer],
    status: int,
    code: str,
    text: str,
    kind: str,
) -> None:
    mailer = make_mailer()
    await mailer.open()
    mailer.client.meta.events.register(
        "before-send.sesv2.SendEmail", answer_with(status, code, {"message": text})
    )
    with pytest.raises(MailError) as info:
        await mailer.send(message())
    error = info.value
    assert not isinstance(error, ThrottledError)
    expected = {
        "permanent": PermanentMailError,
        "connection": MailConnectionError,
        "stop": SendingStoppedError,
        "temporary": TemporaryMailError,
    }[kind]
    assert type(error) is expected
    assert error.reason == f"SES {code}: {text}"
    assert ACCESS_KEY not in error.reason and SECRET not in error.reason


async def test_a_message_that_cannot_be_built_is_permanent(
    verified: str, make_mailer: Callable[..., SesMailer]
) -> None:
    bad = message(to_addr="ada@example.org\r\nBcc: everyone@example.org")
    with pytest.raises(PermanentMailError):
        await make_mailer().send(bad)


# -- the endpoint down or hanging ---------------------------------------------------------


async def test_endpoint_down_is_a_quick_connection_error_without_keys() -> None:
    server = MotoServer().start()
    env = {**server.env, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    server.stop()
    mailer = SesMailer("us-east-1", env=env, timeout=5.0)
    try:
        started = time.monotonic()
        with pytest.raises(MailConnectionError) as info:
            await mailer.send(message())
        assert time.monotonic() - started < 3.0
        assert await mailer.max_send_rate() is None
    finally:
        await mailer.close()
    text = f"{info.value} {info.value.__cause__} {mailer!r}"
    assert server.endpoint in str(info.value)
    assert ACCESS_KEY not in text and SECRET not in text


async def test_a_hanging_endpoint_times_out_within_the_timeout() -> None:
    # A socket that listens but never answers: the kernel accepts the connection, then
    # nothing. The send must give up after `timeout`, not botocore's 60 s default.
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(16)
        endpoint = f"http://{HOST}:{listener.getsockname()[1]}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY}
        env["AWS_SECRET_ACCESS_KEY"] = SECRET
        mailer = SesMailer("us-east-1", env=env, timeout=0.5)
        try:
            started = time.monotonic()
            with pytest.raises(MailConnectionError) as info:
                await mailer.send(message())
            elapsed = time.monotonic() - started
        finally:
            await mailer.close()
    assert 0.4 <= elapsed < 3.0
    assert "0.5 s" in info.value.reason or "timeout" in info.value.reason.lower()


async def test_a_closed_mailer_refuses_to_send(
    verified: str, make_mailer: Callable[..., SesMailer]
) -> None:
    mailer = make_mailer()
    await mailer.send(message())
    await mailer.close()
    await mailer.close()  # idempotent
    with pytest.raises(MailConnectionError):
        await mailer.send(message())


# -- the account's send rate --------------------------------------------------------------


async def test_max_send_rate_falls_back_to_ses_v1_on_moto(
    ses_env: dict[str, str], make_mailer: Callable[..., SesMailer]
) -> None:
    # moto has no sesv2 GetAccount (404); its ses GetSendQuota says 1 message/s.
    assert await make_mailer().max_send_rate() == 1.0


async def test_max_send_rate_reads_sesv2_get_account(
    ses_env: dict[str, str], make_mailer: Callable[..., SesMailer]
) -> None:
    mailer = make_mailer()
    await mailer.open()
    account = {"SendQuota": {"Max24HourSend": 50000.0, "MaxSendRate": 14.0}}
    mailer.client.meta.events.register(
        "before-send.sesv2.GetAccount", answer_with(200, None, account)
    )
    assert await mailer.max_send_rate() == 14.0


# -- configuration and imports ------------------------------------------------------------


def test_from_url_builds_an_ses_mailer_from_the_aws_variables() -> None:
    env = {
        "AWS_REGION": "eu-west-3",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ENDPOINT_URL_SESV2": "http://127.0.0.1:2",
    }
    mailer = from_url("ses://eu-west-1", timeout=3.0, pool_size=32, env=env)
    assert isinstance(mailer, SesMailer)
    assert (mailer.region, mailer.timeout, mailer.pool_size) == ("eu-west-1", 3.0, 32)
    assert mailer.endpoint == "http://127.0.0.1:2"  # the service's own variable wins
    defaulted = from_url("ses://", env=env)
    assert isinstance(defaulted, SesMailer)
    assert defaulted.region == "eu-west-3"
    plain = from_url("ses://us-east-1", env={})
    assert isinstance(plain, SesMailer)
    assert plain.endpoint is None


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ses://", "needs a region"),
        ("ses://us-east-1?pool=3", "takes no options"),
        ("ses://us-east-1/outbox", "only a region"),
        ("ses://key:secret@us-east-1", "only a region"),
        ("ses://email.us-east-1.amazonaws.com", "not an AWS region"),
    ],
)
def test_unusable_ses_urls_are_config_errors(url: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_url(url, env={})
    assert words in str(info.value)
    assert "secret" not in str(info.value)


def test_file_mail_never_imports_aioboto3(tmp_path: Any) -> None:
    code = (
        "import sys\n"
        "from batchrun.mail.base import from_url\n"
        f"from_url({f'file://{tmp_path}'!r})\n"
        "loaded = [m for m in ('aioboto3', 'aiobotocore', 'botocore') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

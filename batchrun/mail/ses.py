"""Amazon SES backend: sesv2 SendEmail with the same raw MIME bytes every backend sends.

Errors are mapped by what they mean for the run, not by HTTP status:

- the provider asked us to slow down -> ``ThrottledError`` (resend; never the user's fault);
- something wrong with this one message or recipient -> ``PermanentMailError``;
- sending paused or the account suspended (``SendingPausedException``,
  ``AccountSuspendedException``) -> ``SendingStoppedError``: the run stops at the first
  one, queues the rest for retry and says why (nothing passes until someone acts);
- something else that fails every message alike (credentials, an unverified sender or
  MAIL FROM domain, the daily quota spent, SES down or unreachable)
  -> ``MailConnectionError``, so the job's circuit breaker stops the run and queues the
  rest for retry instead of failing every user permanently;
- anything else -> ``TemporaryMailError`` (queued for retry, nothing lost).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from batchrun.errors import (
    MailConnectionError,
    MailError,
    MailUnreachableError,
    PermanentMailError,
    causes,
)
from batchrun.job import Skip
from batchrun.mail.address import needs_smtputf8
from batchrun.mail.message import Message
from batchrun.mail.ses_errors import CREDENTIAL_CODES, MAX_REASON_CHARS, client_error
from batchrun.urls import shown

__all__ = ["SesMailer", "endpoint_from_env"]

log = logging.getLogger(__name__)

SES_NO_SMTPUTF8 = "non-ASCII local part: SES does not accept SMTPUTF8 addresses"
# aiobotocore's own default; a smaller pool would make concurrent sends queue for a socket.
MIN_POOL_CONNECTIONS = 10
# What the endpoint not answering looks like through botocore: refused, timed out, dropped.
NOT_ANSWERING = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
)


def endpoint_from_env(env: Mapping[str, str], service_env_name: str) -> str | None:
    """The endpoint URL the standard AWS variables name for a service, if any.

    Args:
        env: the ``AWS_*`` variables (``Settings.extra``).
        service_env_name: the service's variable suffix, e.g. ``SESV2`` for
            ``AWS_ENDPOINT_URL_SESV2``, which wins over ``AWS_ENDPOINT_URL``.
    """
    return env.get(f"AWS_ENDPOINT_URL_{service_env_name}") or env.get("AWS_ENDPOINT_URL") or None


class SesMailer:
    """Sends through Amazon SES (API v2) with one lazily created aioboto3 client."""

    def __init__(
        self,
        region: str,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        pool_size: int = 4,
        configuration_set: str | None = None,
    ) -> None:
        """Configure the client; nothing connects until the first send.

        Args:
            region: the SES region, e.g. ``eu-west-1``.
            env: the ``AWS_*`` variables (``Settings.extra``): keys, session token, profile
                and endpoint (``AWS_ENDPOINT_URL_SESV2`` or ``AWS_ENDPOINT_URL``). Keys
                missing here come from botocore's usual chain (profile files, the
                container or instance role). Keys are never logged nor put in an error.
            timeout: bound in seconds on connecting and on each request as a whole.
            pool_size: HTTP connections kept open at once (at least 10, aiobotocore's own
                default); pass the send concurrency.
            configuration_set: the SES configuration set every message is sent with
                (default: ``BATCHRUN_SES_CONFIGURATION_SET`` in ``env``): its event
                destination reports bounces and complaints (``batchrun events``).
        """
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError("timeout must be a positive number of seconds")
        env = dict(env or {})
        self.region = region
        self.timeout = timeout
        self.pool_size = pool_size
        self.configuration_set = (
            configuration_set or env.get("BATCHRUN_SES_CONFIGURATION_SET") or None
        )
        self.endpoint = endpoint_from_env(env, "SESV2")
        self._v1_endpoint = endpoint_from_env(env, "SES")
        self._secrets = [
            value
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
            if (value := env.get(key))
        ]
        self._session_args = {
            "aws_access_key_id": env.get("AWS_ACCESS_KEY_ID") or None,
            "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY") or None,
            "aws_session_token": env.get("AWS_SESSION_TOKEN") or None,
            "profile_name": env.get("AWS_PROFILE") or None,
        }
        self._config = AioConfig(
            region_name=region,
            connect_timeout=timeout,
            read_timeout=timeout,
            max_pool_connections=max(pool_size, MIN_POOL_CONNECTIONS),
            # One attempt: botocore would otherwise retry throttles itself (and sleep),
            # hiding from AdaptiveRate the signal it needs, and retry an unreachable
            # endpoint, delaying the circuit breaker. The job resends and retries.
            retries={"total_max_attempts": 1, "mode": "standard"},
            user_agent_extra="batchrun",
        )
        self._session: aioboto3.Session | None = None
        self._client: Any = None
        self._stack = AsyncExitStack()
        self._opening = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        where = f", endpoint={self.endpoint!r}" if self.endpoint else ""
        return f"SesMailer(region={self.region!r}{where})"

    @property
    def client(self) -> Any:
        """The aiobotocore ``sesv2`` client, once ``open()`` (or a send) created it.

        A test seam as much as anything: tests register botocore event handlers on
        ``client.meta.events`` (e.g. ``before-send.sesv2.SendEmail``) to inject errors.
        """
        if self._client is None:
            raise RuntimeError("SesMailer is not open: await open() or send() first")
        return self._client

    async def open(self) -> Any:
        """Create the ``sesv2`` client if it does not exist yet, and return it.

        Raises:
            MailConnectionError: the mailer is closed, or no client can be made (an
                unknown profile, an unusable endpoint ...).
        """
        if self._closed:
            raise MailConnectionError("SES mailer is closed")
        if self._client is None:
            async with self._opening:
                if self._closed:
                    raise MailConnectionError("SES mailer is closed")
                if self._client is None:
                    self._client = await self._new_client("sesv2", self.endpoint, self._stack)
        return self._client

    async def close(self) -> None:
        """Close the client and its connections; later sends fail."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            log.debug("closing SES client (%s)", self.region)
        await self._stack.aclose()

    async def send(self, message: Message) -> None:
        """Send one message as raw MIME through sesv2 SendEmail.

        Raises:
            ThrottledError: SES asked us to slow down; resend the same message later.
            SendingStoppedError: sending is paused or the account suspended (a stop).
            MailConnectionError: SES is unreachable, timed out, or refuses every message
                (credentials, unverified sender, quota).
            PermanentMailError: SES rejected this message or recipient.
            TemporaryMailError: any other failure worth retrying later.
            Skip: the address has a non-ASCII local part, which SES never accepts.
        """
        if needs_smtputf8(message.to_addr):
            # SES takes no SMTPUTF8 addresses (its domains may be IDNA): never sendable.
            raise Skip(SES_NO_SMTPUTF8)
        try:
            raw = message.to_bytes()
            recipient = message.envelope_to
        except ValueError as exc:
            raise PermanentMailError(f"message cannot be built: {exc}") from exc
        try:
            async with asyncio.timeout(self.timeout):
                client = await self.open()
                response = await client.send_email(**self._request(message, raw, recipient))
        except MailError:
            raise
        except ClientError as exc:
            raise self._client_error(exc, message) from exc
        except TimeoutError as exc:
            raise MailConnectionError(
                f"SES {self._where()} did not answer within {self.timeout:g} s"
            ) from exc
        except ParamValidationError as exc:
            raise PermanentMailError(self._scrub(f"SES refused the request: {exc}")) from exc
        except (BotoCoreError, aiohttp.ClientError, OSError) as exc:
            raise MailConnectionError(self._scrub(f"SES {self._where()}: {_text(exc)}")) from exc
        log.debug("SES accepted %s as %s", message.message_id, response.get("MessageId"))

    async def check(self) -> None:
        """Ask SES for the account (sesv2 GetAccount) on the client sends use: the endpoint
        answers, takes the keys, and the account may send. The preflight of a run.

        An error reply other than a refused key (an IAM policy that allows only sending, an
        emulator without the call) still shows SES reachable and passes.

        Raises:
            MailUnreachableError: the endpoint does not answer: the connection is refused,
                times out or is dropped.
            MailConnectionError: SES refuses the credentials or says sending is paused for
                the account, or the endpoint's host name is unknown or its TLS fails.
        """
        try:
            async with asyncio.timeout(self.timeout):
                client = await self.open()
                account = await client.get_account()
        except MailError:
            raise
        except ClientError as exc:
            code = _code(exc)
            if code in CREDENTIAL_CODES:
                raise MailConnectionError(
                    self._scrub(f"SES {self._where()} refused the credentials: {code}")
                ) from exc
            log.debug("SES answered GetAccount with %s: reachable", code)
            return
        except TimeoutError as exc:
            raise MailUnreachableError(
                f"SES {self._where()} did not answer within {self.timeout:g} s"
            ) from exc
        except NoCredentialsError as exc:
            raise MailConnectionError(f"SES {self._where()}: {_text(exc)}") from exc
        except (BotoCoreError, aiohttp.ClientError, OSError) as exc:
            error = MailUnreachableError if _not_answering(exc) else MailConnectionError
            raise error(self._scrub(f"cannot reach SES {self._where()}: {_text(exc)}")) from exc
        if account.get("SendingEnabled") is False:
            status = account.get("EnforcementStatus") or "paused"
            raise MailConnectionError(f"SES sending is disabled for this account ({status})")

    def _request(self, message: Message, raw: bytes, recipient: str) -> dict[str, Any]:
        """The SendEmail parameters of one message."""
        request: dict[str, Any] = {
            "FromEmailAddress": message.envelope_sender,
            "Destination": {"ToAddresses": [recipient]},
            "Content": {"Raw": {"Data": raw}},
        }
        if self.configuration_set:
            request["ConfigurationSetName"] = self.configuration_set
        return request

    async def max_send_rate(self) -> float | None:
        """The account's MaxSendRate in messages per second, or None if SES will not say.

        Asks sesv2 GetAccount; if that fails with an error reply (an emulator without it,
        or an IAM policy that allows only the older call), asks ses v1 GetSendQuota.
        Never raises for a failure of either: the rate is a hint, not a requirement.
        """
        try:
            async with asyncio.timeout(self.timeout):
                client = await self.open()
                account = await client.get_account()
        except ClientError as exc:
            log.debug("sesv2 GetAccount failed (%s); trying ses GetSendQuota", _code(exc))
        except (MailError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("SES send quota unavailable: %s", self._scrub(_text(exc)))
            return None
        else:
            return _positive(account.get("SendQuota", {}).get("MaxSendRate"))
        try:
            async with asyncio.timeout(self.timeout), AsyncExitStack() as stack:
                ses = await self._new_client("ses", self._v1_endpoint, stack)
                quota = await ses.get_send_quota()
        except (ClientError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("ses GetSendQuota failed: %s", self._scrub(_text(exc)))
            return None
        return _positive(quota.get("MaxSendRate"))

    async def _new_client(self, service: str, endpoint: str | None, stack: AsyncExitStack) -> Any:
        """Create a client of ``service`` whose lifetime ``stack`` owns."""
        if self._session is None:
            try:
                self._session = aioboto3.Session(region_name=self.region, **self._session_args)
            except BotoCoreError as exc:
                raise MailConnectionError(
                    self._scrub(f"SES: cannot set up AWS session: {_text(exc)}")
                ) from exc
        return await stack.enter_async_context(
            self._session.client(service, endpoint_url=endpoint, config=self._config)
        )

    def _client_error(self, exc: ClientError, message: Message) -> MailError:
        """Map an SES error reply to the MailError it means for this message."""
        return client_error(exc, message.envelope_sender, self._scrub)

    def _where(self) -> str:
        """Name the endpoint for an error: the URL when set (scheme, host and port:
        ``urls.shown``), else the region."""
        return shown(self.endpoint) if self.endpoint else self.region

    def _scrub(self, text: str) -> str:
        """Remove the AWS keys from text that may echo what the service saw."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _code(exc: ClientError) -> str:
    """The error code of a reply, for a log line."""
    return str(exc.response.get("Error", {}).get("Code") or "unknown error")


def _text(exc: BaseException) -> str:
    """Describe a failure in one short line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_REASON_CHARS]


def _not_answering(exc: BaseException) -> bool:
    """Whether a failed call says nothing answers at the endpoint (refused, timed out,
    dropped), rather than a setup to fix (a host name DNS does not know, TLS, a proxy)."""
    if isinstance(exc, BotoCoreError):
        if not isinstance(exc, NOT_ANSWERING):
            return False
        cause = exc.kwargs.get("error")  # the HTTP client's own error
    else:
        down = aiohttp.ServerDisconnectedError | aiohttp.ServerTimeoutError | ConnectionError
        if not isinstance(exc, down | aiohttp.ClientConnectorError):
            return False
        cause = exc
    setup = socket.gaierror | ssl.SSLError | aiohttp.ClientSSLError
    return not any(isinstance(inner, setup) for inner in causes(cause, limit=5))


def _positive(value: object) -> float | None:
    """``value`` as a positive finite float, or None."""
    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
        return float(value)
    return None

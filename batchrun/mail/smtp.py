"""SMTP backend: a small pool of persistent aiosmtplib connections, errors mapped to MailError."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING

import aiosmtplib
from aiosmtplib.auth import auth_login_encode, auth_plain_encode

from batchrun.errors import (
    MailConnectionError,
    MailError,
    MailUnreachableError,
    PermanentMailError,
    TemporaryMailError,
    ThrottledError,
)
from batchrun.mail.address import needs_smtputf8
from batchrun.mail.deadline import Deadlines
from batchrun.mail.message import Message
from batchrun.mail.smtp_reasons import (
    THROTTLE,
    failure_line,
    os_words,
    reply_line,
    setup_fault,
)
from batchrun.mail.smtp_transaction import transaction

if TYPE_CHECKING:
    from batchrun.mail.dkim import DkimSigner

log = logging.getLogger(__name__)

# An idle connection older than this is probed with NOOP before reuse: servers drop idle
# clients (Postfix after 300 s) and a silent drop is only noticed on the next command.
IDLE_PROBE_AFTER_S = 30.0
# QUIT at close is a courtesy; never let a dying server hold up shutdown for long.
QUIT_TIMEOUT_S = 2.0


class SmtpMailer:
    """Sends over SMTP, reusing at most ``pool_size`` connections opened on demand."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        use_tls: bool = False,
        start_tls: bool | None = None,
        timeout: float = 10.0,
        pool_size: int = 4,
        local_hostname: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        dkim: DkimSigner | None = None,
    ) -> None:
        """Configure the pool; nothing connects until the first send.

        Args:
            host: SMTP server name or address.
            port: SMTP server port.
            username: login name, if the server needs AUTH.
            password: login password; never logged nor put in an error.
            use_tls: implicit TLS from the first byte (``smtps://``, usually port 465).
            start_tls: True requires STARTTLS, False never uses it, None upgrades when
                the server offers it (aiosmtplib's default).
            timeout: bound in seconds on connecting (greeting, EHLO, TLS, AUTH together)
                and on sending one message.
            pool_size: most connections open at once.
            local_hostname: name sent in EHLO; default is this machine's FQDN.
            tls_context: custom TLS settings, e.g. a private CA.
            dkim: signs each message before it is sent (for a relay that does not).
        """
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.host = host
        self.port = port
        self.timeout = timeout
        self.pool_size = pool_size
        self._username = username
        self._password = password
        self._use_tls = use_tls
        self._start_tls = start_tls
        self._local_hostname = local_hostname
        self._tls_context = tls_context
        self._dkim = dkim
        # Invariant: every open connection is either in _idle or held by exactly one task
        # inside _slots, and a new one is opened only when _idle is empty, so at most
        # pool_size connections are ever open.
        self._slots = asyncio.Semaphore(pool_size)
        self._deadlines = Deadlines(timeout)  # one timer for every send's bound
        self._idle: list[tuple[aiosmtplib.SMTP, float]] = []  # (client, idle since)
        self._open: set[aiosmtplib.SMTP] = set()
        self._closed = False

    def __repr__(self) -> str:
        user = f"{self._username}:***@" if self._username is not None else ""
        return f"SmtpMailer({user}{self.host}:{self.port}, pool_size={self.pool_size})"

    @property
    def username(self) -> str | None:
        """The AUTH user name, as decoded from the URL (None: no AUTH)."""
        return self._username

    @property
    def password(self) -> str | None:
        """The AUTH password, as decoded from the URL; never in repr() nor in an error."""
        return self._password

    @property
    def use_tls(self) -> bool:
        """Whether the connection is TLS from the start (``smtps://``)."""
        return self._use_tls

    @property
    def start_tls(self) -> bool | None:
        """STARTTLS: True requires it, False never uses it, None upgrades when offered."""
        return self._start_tls

    @property
    def open_connections(self) -> int:
        """How many connections are open now (idle or sending)."""
        return len(self._open)

    async def send(self, message: Message) -> None:
        """Send one message on a pooled connection.

        Raises:
            TemporaryMailError: a 4xx reply; worth retrying later.
            MailConnectionError: the server is unreachable, hung up, timed out or
                refused the session (421, greeting, AUTH, sender).
            PermanentMailError: a 5xx reply for the recipient or the content, or an
                address that cannot be sent (a non-ASCII local part, when the server
                does not offer SMTPUTF8).
        """
        if self._closed:
            raise MailConnectionError("SMTP mailer is closed")
        # RFC 6531: only a non-ASCII local part needs SMTPUTF8; a domain goes in IDNA.
        utf8 = needs_smtputf8(message.to_addr)
        try:
            raw = message.to_bytes(utf8=utf8)
            recipient = message.envelope_to
            if self._dkim is not None:
                raw = self._dkim.sign(raw)
        except ValueError as exc:
            raise PermanentMailError(f"message cannot be built: {exc}") from exc
        async with self._slots:
            if self._closed:  # closed while this send waited for a slot
                raise MailConnectionError("SMTP mailer is closed")
            client = await self._checkout()
            reusable = False
            try:
                # One deadline for the whole transaction; timeout=None spares aiosmtplib's
                # own per-reply timers (four per message), which this one already covers.
                # It is one timer for all sends (deadline.py), not one per message.
                with self._deadlines.bound():
                    if utf8 and not await self._offers_smtputf8(client):
                        reusable = True  # nothing was sent on this session
                        raise PermanentMailError(
                            "the address's local part is not ASCII and SMTP "
                            f"{self.host}:{self.port} does not offer SMTPUTF8"
                        )
                    await transaction(client, message.envelope_sender, recipient, raw)
                reusable = True
            except aiosmtplib.SMTPResponseException as exc:
                # transaction() already sent RSET; a 421 means the server is closing. A
                # client still connected is otherwise clean for the next message.
                reusable = client.is_connected and exc.code != 421
                raise self._reply_error(exc) from exc
            except aiosmtplib.SMTPRecipientsRefused as exc:
                reusable = client.is_connected
                raise self._reply_error(exc.recipients[0]) from exc
            except (aiosmtplib.SMTPNotSupported, ValueError) as exc:
                # Checked before MAIL FROM (e.g. a non-ASCII address without SMTPUTF8),
                # so the session has no open transaction.
                reusable = client.is_connected
                raise PermanentMailError(
                    self._scrub(f"cannot send to this address: {exc}")
                ) from exc
            except TimeoutError as exc:
                raise MailConnectionError(
                    f"SMTP {self.host}:{self.port} timed out after {self.timeout:g} s"
                ) from exc
            except (aiosmtplib.SMTPException, OSError) as exc:
                raise MailConnectionError(
                    self._scrub(f"SMTP {self.host}:{self.port}: {exc}")
                ) from exc
            finally:
                self._checkin(client, reusable)

    async def _offers_smtputf8(self, client: aiosmtplib.SMTP) -> bool:
        """Whether this session's server offers SMTPUTF8 (saying EHLO first if needed)."""
        if client.is_ehlo_or_helo_needed:
            try:
                await client.ehlo(timeout=None)
            except aiosmtplib.SMTPHeloError:
                return False  # no EHLO, no extensions: sendmail would fall back to HELO
        return client.supports_extension("smtputf8")

    async def check(self) -> None:
        """Open one session as a send would (greeting, EHLO, STARTTLS and login as
        configured), then QUIT; nothing is sent. The preflight of a run.

        Raises:
            MailUnreachableError: nothing answers: the connection is refused, times out or
                is dropped, or the server says 421 (closing, down for now).
            MailConnectionError: the server refuses the session or the login, the host name
                is unknown, TLS fails; the message names ``smtp://host:port`` and the cause,
                no password.
        """
        where = f"{'smtps' if self._use_tls else 'smtp'}://{self.host}:{self.port}"
        client = self._client()
        try:
            async with asyncio.timeout(self.timeout):
                await client.connect()
        except BaseException as exc:
            client.close()
            down = False  # an outage, not a setup to fix
            if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
                reason = f"{where} refused the login: {reply_line(exc.code, exc.message)}"
            elif isinstance(exc, aiosmtplib.SMTPResponseException):
                reason = f"{where} refused the session: {reply_line(exc.code, exc.message)}"
                down = exc.code == 421  # as a send's 421: connection-level
            elif isinstance(exc, TimeoutError):
                reason = f"{where} did not answer within {self.timeout:g} s"
                down = True
            elif isinstance(exc, OSError) or isinstance(exc.__cause__, OSError):
                reason = f"cannot connect to {where}: {os_words(exc)}"
                down = not setup_fault(exc)
            elif isinstance(exc, aiosmtplib.SMTPException):
                reason = f"{where}: {failure_line(exc)}"  # no STARTTLS or AUTH offered ...
            else:
                raise  # cancelled
            error = MailUnreachableError if down else MailConnectionError
            raise error(self._scrub(reason)) from None
        await self._quit(client)

    async def close(self) -> None:
        """Say QUIT on idle connections and close them; later sends fail."""
        self._closed = True
        idle, self._idle = self._idle, []
        await asyncio.gather(*(self._quit(client) for client, _ in idle))
        # Connections still sending are closed by _checkin when their task finishes.

    async def _checkout(self) -> aiosmtplib.SMTP:
        """Return a live pooled connection, or open a new one (caller holds a slot)."""
        while self._idle:
            client, since = self._idle.pop()  # LIFO: the warmest connection first
            if not client.is_connected:
                self._discard(client)
                continue
            if time.monotonic() - since > IDLE_PROBE_AFTER_S:
                try:
                    await client.noop(timeout=self.timeout)
                except (aiosmtplib.SMTPException, OSError):
                    self._discard(client)
                    continue
                except BaseException:
                    self._discard(client)  # cancelled mid-probe: its state is unknown
                    raise
            return client
        return await self._connect()

    def _checkin(self, client: aiosmtplib.SMTP, reusable: bool) -> None:
        """Return a connection to the pool, or close it if its state is unknown."""
        if reusable and client.is_connected and not self._closed:
            self._idle.append((client, time.monotonic()))
        else:
            self._discard(client)

    def _discard(self, client: aiosmtplib.SMTP) -> None:
        """Close a connection without QUIT (it is broken or mid-transaction)."""
        client.close()
        if client in self._open:
            self._open.discard(client)
            log.debug("closed SMTP connection to %s:%d", self.host, self.port)

    async def _connect(self) -> aiosmtplib.SMTP:
        """Open, greet, secure and log in one connection within ``timeout``."""
        client = self._client()
        where = f"SMTP {self.host}:{self.port}"
        try:
            async with asyncio.timeout(self.timeout):
                await client.connect()
        except aiosmtplib.SMTPAuthenticationError as exc:
            client.close()
            raise MailConnectionError(
                self._scrub(f"{where} refused the login: {reply_line(exc.code, exc.message)}")
            ) from None
        except aiosmtplib.SMTPResponseException as exc:
            client.close()
            raise MailConnectionError(
                self._scrub(f"{where} refused the session: {reply_line(exc.code, exc.message)}")
            ) from exc
        except TimeoutError as exc:
            client.close()
            raise MailConnectionError(f"{where} did not answer within {self.timeout:g} s") from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            client.close()
            raise MailConnectionError(
                self._scrub(f"{where}: cannot connect: {failure_line(exc)}")
            ) from exc
        except BaseException:
            client.close()
            raise
        if client.is_ehlo_or_helo_needed:  # transaction() sends no EHLO of its own
            try:
                async with asyncio.timeout(self.timeout):
                    await client.ehlo()
            except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
                client.close()
                raise MailConnectionError(
                    self._scrub(f"{where} refused EHLO: {failure_line(exc)}")
                ) from exc
        self._open.add(client)
        log.debug(
            "opened SMTP connection to %s:%d (%d of %d)",
            self.host,
            self.port,
            len(self._open),
            self.pool_size,
        )
        return client

    def _client(self) -> aiosmtplib.SMTP:
        """A new, unconnected client with this mailer's settings."""
        return aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            username=self._username,
            password=self._password,
            use_tls=self._use_tls,
            start_tls=self._start_tls,
            timeout=self.timeout,
            local_hostname=self._local_hostname,
            tls_context=self._tls_context,
        )

    async def _quit(self, client: aiosmtplib.SMTP) -> None:
        """Close one idle connection politely, giving up quickly."""
        try:
            if client.is_connected:
                await client.quit(timeout=min(self.timeout, QUIT_TIMEOUT_S))
        except (aiosmtplib.SMTPException, OSError):
            pass  # the server is going away anyway; closing below is what matters
        finally:
            self._discard(client)

    def _reply_error(self, exc: aiosmtplib.SMTPResponseException) -> MailError:
        """Map an SMTP error reply to the MailError it means for this message."""
        reason = self._scrub(reply_line(exc.code, exc.message))
        if exc.code == 454 or (400 <= exc.code < 500 and THROTTLE.search(exc.message)):
            # "454 Throttling failure: Maximum sending rate exceeded" and its kin: the
            # server wants a lower rate; the job slows down and sends the message again.
            return ThrottledError(reason)
        if exc.code == 421:
            # The server is closing the channel: a connection-level failure.
            return MailConnectionError(reason)
        if isinstance(exc, aiosmtplib.SMTPSenderRefused) and exc.code >= 500:
            # A refused sender fails every message alike (misconfigured --from or
            # relay): treat it as the backend being unusable, never as the user's fault.
            return MailConnectionError(f"sender refused: {reason}")
        if 400 <= exc.code < 500:
            return TemporaryMailError(reason)
        if 500 <= exc.code < 600:
            return PermanentMailError(reason)
        return TemporaryMailError(f"unexpected reply {reason}")

    def _scrub(self, text: str) -> str:
        """Remove the password from text that may echo what the server saw: as given, and
        as AUTH PLAIN and AUTH LOGIN sent it (base64)."""
        if self._password:
            user = self._username or ""
            for secret in (
                self._password,
                auth_plain_encode(user, self._password).decode(),
                auth_login_encode(user, self._password)[1].decode(),
            ):
                text = text.replace(secret, "***")
        return text

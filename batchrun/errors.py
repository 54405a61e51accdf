"""Errors batchrun raises, one tree so the CLI and the Lambda handler catch one base.

    BatchrunError                    anything batchrun reports as one clear line
    ├── UsageError                   bad input from the user (exit 2)
    │   └── InvalidTokenError        an unsubscribe token that is forged, altered or truncated
    ├── ConfigError                  an unusable setting or URL (exit 2)
    │   └── TemplateError            an email template is missing, broken or lacks a variable
    ├── DatabaseError                the database failed or cannot be reached
    │   ├── NotMigratedError         batchrun's tables are missing: run `batchrun db migrate`
    │   ├── LockTimeoutError         rolled back on a lock wait, deadlock or serialization failure
    │   ├── OutcomeUnknownError      a job's statement lost its reply: it may or may not have run
    │   └── StatementError           a job's statement as written is refused (syntax, no such
    │                                table or column): the job's mistake, every time
    ├── MailError                    a message could not be sent; carries a reason
    │   ├── TemporaryMailError       worth retrying later (4xx, timeout, throttling)
    │   │   ├── MailConnectionError  the backend itself is unreachable (feeds the breaker)
    │   │   │   ├── SendingStoppedError  the provider refuses all mail (SES paused): stop now
    │   │   │   └── MailUnreachableError its check found no server answering (refused,
    │   │   │                            timed out, dropped): a run hands its period on
    │   │   └── ThrottledError       the provider said slow down: resend, not a failure
    │   └── PermanentMailError       never worth retrying (5xx for the recipient, rejected)
    ├── QueueError                   the retry queue failed or cannot be reached
    └── JobError                     a job broke its contract (a page out of order ...)

Driver and protocol errors are converted at the boundary with ``raise X(...) from exc``.
Messages never contain a password: URLs are masked with ``batchrun.urls.mask_url``.
"""

from __future__ import annotations

from collections.abc import Iterator


class BatchrunError(Exception):
    """Base of every error batchrun reports to a user."""

    exit_code = 1


class UsageError(BatchrunError):
    """Bad input on the command line or in an event."""

    exit_code = 2


class InvalidTokenError(UsageError):
    """An unsubscribe token that is forged, altered, truncated or signed with another
    secret: nothing in it is trusted, and the message names nothing from it."""

    def __init__(self) -> None:
        super().__init__("not a valid unsubscribe token (altered, truncated or signed elsewhere)")


class ConfigError(BatchrunError):
    """An unusable setting, such as an unknown URL scheme."""

    exit_code = 2


class DatabaseError(BatchrunError):
    """The database failed or cannot be reached."""


class NotMigratedError(DatabaseError):
    """batchrun's tables are missing or older than this version."""


class LockTimeoutError(DatabaseError):
    """A statement was rolled back on a lock wait, a deadlock or a serialization failure
    (MySQL 1205 / 1213, PostgreSQL 55P03 / 40P01 / 40001) more times than it went again."""


class OutcomeUnknownError(DatabaseError):
    """The connection was lost after a job's statement was sent and before its reply: it
    may have run or not. batchrun never runs it again; the entity is retried as a whole
    (the job's own keys make that safe) and counted ``unknown_outcome``."""


class StatementError(DatabaseError):
    """The database refused one of a job's own statements as written: its SQL does not
    parse, or names a table or column that does not exist. The job's mistake, the same for
    every entity (a page that does it is a ``JobError``; a ``process``, a bug)."""


class MailError(BatchrunError):
    """A message could not be sent."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TemporaryMailError(MailError):
    """Sending may succeed later: queue the user for retry."""


class MailConnectionError(TemporaryMailError):
    """The mail backend itself is down, refusing or hanging."""


class SendingStoppedError(MailConnectionError):
    """The provider refuses every message until someone acts (SES sending paused, account
    suspended): the run stops at once, as if the circuit breaker were open."""


class MailUnreachableError(MailConnectionError):
    """The mailer's check (``check()``, before a run) found nothing answering: the connection
    was refused, timed out or dropped. An outage, not a setup to fix (a refused login, an
    unknown host, an outbox that cannot be written raise MailConnectionError itself): a run
    claims nothing and hands its period on to the retry queue, exit 3."""


class ThrottledError(TemporaryMailError):
    """The provider asked us to slow down; the message was not sent and may be resent at once.

    Never counts as the user failing, nor as the backend being down: the sender lowers its
    rate (``batchrun.policy.rate.AdaptiveRate``) and resends.
    """

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        # the provider's own hint (e.g. a Retry-After header), when it gave one
        self.retry_after_s = retry_after_s


class PermanentMailError(MailError):
    """Sending will never succeed for this recipient."""


class QueueError(BatchrunError):
    """The retry queue failed or cannot be reached.

    ``unsent``, from a send: the positions of the messages it did not queue, when the
    queue can tell (the others were queued); None when it cannot (take none as queued).
    """

    unsent: tuple[int, ...] | None = None


class TemplateError(ConfigError):
    """An email template is missing, fails to compile, or prints a variable it was not given.

    A ``ConfigError``: the fix is in the templates folder, and every entity would fail alike.
    """


class MissingTemplateError(TemplateError):
    """The template a send names is in no templates folder (a typo in ``template=``): the
    run stops at its first use, as it does for one missing from the job's own folder."""


class JobError(BatchrunError):
    """A job broke its contract at run time (a page out of order, a row without an id)."""


def causes(exc: BaseException | None, *, limit: int = 8) -> Iterator[BaseException]:
    """``exc``, then what it was raised from, down the chain: the ``os_error`` an aiohttp
    connector error carries where there is one, else ``__cause__``; at most ``limit`` of
    them, so a chain that loops ends. How a driver's error tells a server that does not
    answer (refused, timed out) from a setup to fix (a host DNS does not know, TLS)."""
    for _ in range(limit):
        if not isinstance(exc, BaseException):  # None, or what a driver left in its place
            return
        yield exc
        inner = getattr(exc, "os_error", None)
        exc = inner if isinstance(inner, BaseException) and inner is not exc else exc.__cause__

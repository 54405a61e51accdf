"""What an SES error reply means for the run: the error codes by kind, and the
``MailError`` each becomes (see mail/ses.py's docstring for the rules)."""

from __future__ import annotations

import math
from collections.abc import Callable

from botocore.exceptions import ClientError

from batchrun.errors import (
    MailConnectionError,
    MailError,
    PermanentMailError,
    SendingStoppedError,
    TemporaryMailError,
    ThrottledError,
)

# AWS error messages are echoed into reasons that end up in the ledger and on screen.
MAX_REASON_CHARS = 300

_THROTTLE_CODES = frozenset(
    {
        "TooManyRequestsException",  # sesv2 SendEmail over the account's MaxSendRate
        "Throttling",  # ses v1 (query protocol)
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "SlowDown",
    }
)
# Failures of the account or its setup: every message would fail alike, so they must trip
# the circuit breaker rather than mark each user as permanently failed.
# Nothing is sent until someone acts on the account (or a configuration set's sending is
# resumed): stop the run at the first one.
_STOP_CODES = frozenset({"AccountSuspendedException", "SendingPausedException"})
# The keys themselves are wrong (not merely not allowed): account failures too.
CREDENTIAL_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidSignatureException",
        "MissingAuthenticationToken",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
    }
)
_ACCOUNT_CODES = (
    frozenset(
        {
            "MailFromDomainNotVerifiedException",
            # SendEmail names no resource of ours but a configuration set or identity: a
            # missing one is a setup error, the same for every message
            "NotFoundException",
            "LimitExceededException",  # an account limit (a sending-rate one is caught first)
            "AccessDenied",
            "AccessDeniedException",
            "OptInRequired",
        }
    )
    | CREDENTIAL_CODES
)
_SERVICE_CODES = frozenset(
    {"InternalFailure", "InternalError", "InternalServerError", "ServiceUnavailable"}
)
# Per message or per recipient: never worth resending as it is.
_MESSAGE_CODES = frozenset(
    {
        "MessageRejected",
        "BadRequestException",
        "InvalidParameterValue",
        "ValidationException",
    }
)


def client_error(exc: ClientError, envelope_sender: str, scrub: Callable[[str], str]) -> MailError:
    """The MailError an SES error reply means for a message from ``envelope_sender``;
    ``scrub`` takes the AWS keys out of the reason."""
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or "")
    text = " ".join(str(error.get("Message") or "").split())
    metadata = exc.response.get("ResponseMetadata", {})
    status = int(metadata.get("HTTPStatusCode") or 0)
    reason = scrub(f"SES {code or status}: {text}" if text else f"SES {code or status}")
    reason = reason[:MAX_REASON_CHARS]
    lowered = text.lower()
    if "daily message quota" in lowered or "daily sending quota" in lowered:
        # Worded as a throttle, but nothing passes until the 24-hour window moves on.
        return MailConnectionError(reason)
    if code in _THROTTLE_CODES or status == 429 or "sending rate exceeded" in lowered:
        headers = metadata.get("HTTPHeaders", {})
        return ThrottledError(reason, retry_after_s=retry_after(headers.get("retry-after")))
    if code in _STOP_CODES:
        return SendingStoppedError(reason)
    if code in _ACCOUNT_CODES:
        return MailConnectionError(reason)
    if code == "MessageRejected" and envelope_sender.lower() in lowered:
        # "Email address is not verified ... failed the check ...: <sender>": the
        # sender identity, which every message shares, not this recipient.
        return MailConnectionError(f"sender refused: {reason}")
    if code in _MESSAGE_CODES:
        return PermanentMailError(reason)
    if code in _SERVICE_CODES or status >= 500:
        return MailConnectionError(reason)
    return TemporaryMailError(reason)


def retry_after(value: object) -> float | None:
    """A Retry-After header in seconds (the HTTP-date form is ignored)."""
    try:
        seconds = float(str(value))
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None

"""How the SQS queue reports a failed call: botocore's and the network's errors as one
``QueueError`` line, with the queue URL masked and no AWS secret in the text."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from batchrun.errors import QueueError
from batchrun.urls import mask_url

SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
# A receipt that no longer holds the message: it is visible again or another consumer has it,
# so it comes back anyway and the job's idempotency makes the repeat harmless.
STALE_RECEIPT = frozenset({"ReceiptHandleIsInvalid", "MessageNotInflight"})
ERRORS = (ClientError, BotoCoreError, aiohttp.ClientError, OSError, TimeoutError)


@contextlib.contextmanager
def mapped(action: str, queue_url: str, env: Mapping[str, str]) -> Iterator[None]:
    """Turn botocore and network errors into QueueError, with no secret in the text."""
    try:
        yield
    except ERRORS as exc:
        detail = str(exc) or type(exc).__name__
        raise QueueError(
            masked(f"could not {action} SQS queue {mask_url(queue_url)}: {detail}", env)
        ) from exc


def masked(text: str, env: Mapping[str, str]) -> str:
    """``text`` with URL passwords and the AWS credentials of ``env`` replaced by ***."""
    text = mask_url(text)
    for key in SECRETS:
        secret = env.get(key)
        if secret:
            text = text.replace(secret, "***")
    return text


def error_code(exc: BaseException | None) -> str:
    """The short error code of a ClientError (``AWS.SimpleQueueService.X`` -> ``X``)."""
    if not isinstance(exc, ClientError):
        return ""
    error = exc.response.get("Error", {})
    code = str(error.get("QueryErrorCode") or error.get("Code") or "")
    return code.rsplit(".", 1)[-1]

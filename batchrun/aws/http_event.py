"""The Lambda's HTTP event (a Function URL or an API Gateway HTTP API, payload 2.0) on
``BATCHRUN_UNSUBSCRIBE_URL/TOKEN``: one-click unsubscribe (``batchrun.unsubscribe``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from batchrun import unsubscribe
from batchrun.aws.invocation import log_line
from batchrun.aws_secrets import database_url, forget
from batchrun.errors import BatchrunError
from batchrun.runtime.resources import open_backends
from batchrun.settings import Settings
from batchrun.urls import mask_text

log = logging.getLogger("batchrun")


async def handle_http(
    event: Mapping[str, Any], settings: Settings, request_id: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """An unsubscribe request: the database is opened for a POST with a genuine token only."""
    method = str(event["requestContext"]["http"].get("method", ""))
    path = str(event.get("rawPath") or event["requestContext"]["http"].get("path") or "")
    signer = unsubscribe.Signer.from_settings(settings)
    if signer is None:
        log.error("an unsubscribe request, but BATCHRUN_UNSUBSCRIBE_SECRET is not set")
        return _http_response(unsubscribe.unavailable()), {"Unsubscribes": 0}
    applied = 0

    current = settings

    async def suppress(request: unsubscribe.UnsubscribeRequest) -> bool:
        nonlocal applied, current
        if current.db_secret_arn:  # a GET or a bad token never fetches the secret
            url = await database_url(current.db_secret_arn, current.extra)
            current = replace(current, db_url=url)
        async with open_backends(current) as backends:
            added = await unsubscribe.apply(backends.store, request)
        applied = 1
        return added

    try:
        response = await unsubscribe.respond(method, path, signer, suppress)
    except BatchrunError as exc:
        # Not an invocation error (the client would get AWS's bare 502): a page saying to
        # try again, and the masked reason in the log.
        if current.db_secret_arn:
            forget(current.db_secret_arn)  # a rotated password is fetched afresh next time
        text = mask_text(str(exc), current.db_url)
        log_line("error", request_id, "http", error=text)
        response = unsubscribe.unavailable()
    return _http_response(response), {"Unsubscribes": applied}


def _http_response(response: unsubscribe.Response) -> dict[str, Any]:
    """The payload 2.0 response a Function URL or an HTTP API returns as it stands."""
    return {
        "statusCode": response.status,
        "headers": response.headers,
        "body": response.body,
        "isBase64Encoded": False,
    }

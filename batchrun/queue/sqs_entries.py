"""What SQS is told: where a queue is (its URL's account, name, region and endpoint),
one batch entry (its FIFO group and deduplication id, its reason attribute), batches
within SQS's limits, and delays and visibilities in whole seconds."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from batchrun.errors import ConfigError
from batchrun.urls import mask_url, split

BATCH = 10  # SQS's most entries per batch call
BATCH_BYTES = 250 * 1024  # SQS caps a whole batch request at 256 KiB; keep a margin
MAX_VISIBILITY_S = 43_200  # SQS's longest visibility timeout (12 hours)
# SQS's longest DelaySeconds: a send asking for longer is delayed this long (a consumer's
# own backoff, a visibility change, reaches 12 hours)
MAX_DELAY_S = 900
_GROUP_CHARS = re.compile(r"[^!-~]")  # SQS allows printable ASCII only in a group id
_AWS_HOST = re.compile(r"^sqs(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
_LEGACY_HOST = re.compile(r"^([a-z0-9-]+)\.queue\.amazonaws\.com(?:\.cn)?$")


@dataclass(frozen=True, slots=True)
class Location:
    """Where an SQS queue is."""

    account: str
    name: str
    region: str
    endpoint: str | None  # None: AWS's own for the region


def locate(url: str, env: Mapping[str, str]) -> Location:
    """The queue a URL names, with the region and endpoint to reach it (``env``: the AWS
    variables; an emulator's URL names its own endpoint).

    Raises:
        ConfigError: not an SQS queue URL, or no region to be had.
    """
    parts = split(url)
    segments = [s for s in parts.path.split("/") if s]
    if parts.scheme not in ("http", "https") or not parts.hostname or len(segments) != 2:
        raise ConfigError(
            f"bad SQS queue URL {mask_url(url)!r}: expected "
            "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
        )
    host = parts.hostname.lower()
    match = _AWS_HOST.match(host) or _LEGACY_HOST.match(host)
    region = match[1] if match else env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigError(
            f"no AWS region for {mask_url(url)}: set AWS_REGION (the URL's host does not name one)"
        )
    endpoint = env.get("AWS_ENDPOINT_URL_SQS") or env.get("AWS_ENDPOINT_URL")
    if not endpoint and match is None:
        # Not an AWS host, so the URL itself names the endpoint (an emulator such as moto).
        endpoint = f"{parts.scheme}://{parts.netloc}"
    return Location(segments[0], segments[1], region, endpoint or None)


def entry(
    entry_id: str,
    body: str,
    fifo: bool,
    *,
    reason: str = "",
    dedup: str = "",
    call: str = "",
) -> dict[str, Any]:
    """One batch entry; ``call`` names the ``send`` call, so its resends keep their key."""
    entry: dict[str, Any] = {"Id": entry_id, "MessageBody": body}
    if reason:
        entry["MessageAttributes"] = {
            "reason": {"DataType": "String", "StringValue": reason[:1000]}
        }
    if fifo:
        group, key = fifo_keys(body, call)
        entry["MessageGroupId"] = _GROUP_CHARS.sub("_", group)[:128]
        entry["MessageDeduplicationId"] = hashlib.sha256((dedup or key).encode()).hexdigest()
    return entry


def delay_seconds(seconds: float) -> int:
    """A send's DelaySeconds: whole seconds, rounded up, at most SQS's 15 minutes."""
    return max(0, min(MAX_DELAY_S, math.ceil(seconds)))


def visibility(seconds: float) -> int:
    return max(0, min(MAX_VISIBILITY_S, math.ceil(seconds)))


def batches(entries: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Entries in batches of at most 10 and 250 KiB of bodies."""
    batch: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        entry_size = len(entry["MessageBody"].encode())
        if batch and (len(batch) == BATCH or size + entry_size > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(entry)
        size += entry_size
    if batch:
        yield batch


def fifo_keys(body: str, call: str) -> tuple[str, str]:
    """(MessageGroupId, dedup key) of a body: the entity for a retry or a task, the period
    otherwise.

    One group per (job, entity): SQS FIFO delivers a group's messages one at a time, so two
    tasks for one entity never run at once (seed 000's per-user serial execution). A
    retry's dedup key is job, period, entity and attempt, so a resend of the same failure
    within SQS's five-minute window is dropped by SQS; a submitted task's and a
    continuation's are unique to the ``send`` call (``call``): a second submit, or a second
    hand-off from the same cursor, must not be dropped. A body that is not ours is keyed by
    itself. Bodies of batchrun 0.1 (``month``, ``user_id``) are read too.
    """
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return "batchrun", f"body:{body}"
    job, period = data.get("job"), data.get("period", data.get("month"))
    entity = data.get("id", data.get("user_id"))
    kind = data.get("kind")
    if kind == "entity_task" and entity is not None:
        # One group per entity keeps its tasks in submission order; a key runs once. A
        # task sent again because it looked lost has a group of its own: in the entity's,
        # it would come after the messages that wait for it (the database keeps the order).
        group = f"{job}:{entity}:resent" if data.get("resent") == 1 else f"{job}:{entity}"
        return group, f"{job}:task:{data.get('key')}"
    if kind in ("retry", "task") and entity is not None:
        group = f"{job}:{entity}"
        if kind == "task":
            return group, f"{job}:{period}:{entity}:task:{call}"
        return group, f"{job}:{period}:{entity}:{data.get('attempt', 0)}"
    if kind == "continuation":
        return f"{job}:{period}", f"{job}:{period}:after:{data.get('after_id')}:{call}"
    return "batchrun", f"body:{body}"

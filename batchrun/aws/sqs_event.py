"""The Lambda's SQS event: work records (retries, submitted tasks, continuations, shards)
on the one road, settled by the same applier the CLI uses, their failures reported in
``batchItemFailures``; and, from ``BATCHRUN_EVENTS_QUEUE`` only, SES event records (bounces,
complaints), each applied alone."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from batchrun.aws.invocation import make_runtime, summary_metrics
from batchrun.control.runrecord import RunRecord
from batchrun.db.store import State
from batchrun.errors import MailUnreachableError, UsageError
from batchrun.events import ses as mail_events
from batchrun.pipeline.apply import Disposition, settle_messages
from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.run import Options
from batchrun.queue.base import Received
from batchrun.registry import Registry
from batchrun.runtime.resources import open_backends
from batchrun.settings import Settings

log = logging.getLogger("batchrun")


async def handle_sqs(
    event: Mapping[str, Any],
    settings: Settings,
    registry: Registry,
    stop: StopToken,
    options: Options,
) -> tuple[dict[str, Any], dict[str, float]]:
    records = _records(event["Records"])
    items = [
        Received(
            message_id=r["messageId"],
            receipt=str(r.get("receiptHandle", "")),
            body=str(r.get("body", "")),
            receive_count=_int(_attributes(r).get("ApproximateReceiveCount"), 1),
        )
        for r in records
    ]
    failures: list[dict[str, str]] = []
    metrics: dict[str, float] = {"Messages": len(items)}
    events_queue = settings.environ.get("BATCHRUN_EVENTS_QUEUE", "")
    ses = [_from_events_queue(r, events_queue) for r in records]
    if any(ses):
        failures, metrics["MailEvents"] = await _mail_events(
            settings, registry, stop, [item for item, yes in zip(items, ses, strict=True) if yes]
        )
        items = [item for item, yes in zip(items, ses, strict=True) if not yes]
        if not items:
            metrics["Failures"] = len(failures)
            return {"batchItemFailures": failures}, metrics
    if not events_queue and any(mail_events.looks_like(item.body) for item in items):
        # So a deployment that relied on the shape alone learns why its SES events now
        # fail (whoever may send to the retry queue could suppress any address).
        log.warning(
            "an SES event notification on a queue other than BATCHRUN_EVENTS_QUEUE (unset) "
            "is not applied: set BATCHRUN_EVENTS_QUEUE to the events queue's ARN"
        )
    async with open_backends(
        settings,
        mail=True,
        queue=True,
        concurrency=options.concurrency,
        jobs=[entry.job for entry in registry.values()],
    ) as backends:
        assert backends.queue is not None
        runtime = make_runtime(registry, backends, settings, stop)
        async with RunRecord(runtime, kind="lambda") as record:
            try:
                await runtime.requeue_unqueued()  # checks the mail server first, as process
                dispositions = await runtime.process(items, options)
            except MailUnreachableError as exc:
                # An outage, as a worker waits one out: every record waits on the queue,
                # kept (a fresh copy near the redrive limit), so none is dead-lettered
                # by receives that were no attempt.
                log.error("%s: the batch's %d messages wait on the queue", exc, len(items))
                dispositions = _kept(items, str(exc), settings.lease_s)
                metrics["MailDown"] = 1
            failed = sum(1 for v in dispositions.values() if v.action != "delete")
            await record.end(3 if failed else 0, {"messages": len(items), "failed": failed})
        unknown: dict[str, int] = {}
        for item in items:
            disposition = dispositions.get(item.message_id, Disposition("later"))
            _add(metrics, disposition)
            if disposition.unknown_job is not None:
                # Not this function's job (BATCHRUN_JOBS): left for one that knows it.
                metrics["UnknownJob"] = metrics.get("UnknownJob", 0) + 1
                unknown[disposition.unknown_job] = unknown.get(disposition.unknown_job, 0) + 1
        for job, count in unknown.items():
            # A warning: a Lambda's log shows no info line, and the CLI's last line is not here.
            log.warning(
                "%d messages for job %r, which this function does not know (BATCHRUN_JOBS): "
                "left on the queue for one that does",
                count,
                job,
            )
        # The one applier the CLI uses too; a dead record goes straight to the DLQ and
        # succeeds, poison fails (the queue's redrive policy dead-letters it).
        unsettled = await settle_messages(backends.queue, items, dispositions, event_source=True)
        failures += [{"itemIdentifier": item.message_id} for item in unsettled]
        # Settled: what time is left may look for lost tasks, if the queue holds no more
        # than this batch (deleted by the event source mapping once the handler returns);
        # the sweep stops at the deadline's margin.
        if not stop.stopping:
            await runtime.resend_lost_tasks(backends.queue, in_flight=len(items))
    metrics["Failures"] = len(failures)
    return {"batchItemFailures": failures}, metrics


def _kept(items: list[Received], reason: str, lease_s: float) -> dict[str, Disposition]:
    """Each record left on the queue, no receive counted against it: back after a lease,
    doubling with each receive up to eight (15 s, 30, 60, 120 at the default lease), so
    a long outage does not invoke the function for every batch every lease."""
    return {
        item.message_id: Disposition(
            "later",
            reason,
            delay_s=lease_s * 2 ** min(max(item.receive_count - 1, 0), 3),
            counted=False,
            keep=True,
            awaited=False,
        )
        for item in items
    }


def _records(records: list[Any]) -> list[Mapping[str, Any]]:
    """The event's records, each an object with its own ``messageId``.

    Raises:
        UsageError: a record that is not one, or two records with one id: the Lambda
            names a failed record by its id alone, so such a batch could only be
            settled wrongly (SQS itself never sends one; a hand-made test event may).
    """
    seen: set[str] = set()
    for number, record in enumerate(records, 1):
        if not isinstance(record, Mapping):
            raise UsageError(f"SQS event: record {number} is not an object")
        message_id = record.get("messageId")
        if not isinstance(message_id, str) or not message_id:
            raise UsageError(f"SQS event: record {number} has no messageId")
        if message_id in seen:
            raise UsageError(f"SQS event: record {number} repeats messageId {message_id[:80]!r}")
        seen.add(message_id)
    return records


def _queue_id(url_or_arn: str) -> tuple[str, str, str]:
    """(region, account, name) of a queue from its ARN (``arn:aws:sqs:REGION:ACCOUNT:NAME``)
    or URL (``https://sqs.REGION.amazonaws.com/ACCOUNT/NAME``; region "" when the host
    does not say, as an emulator's does not)."""
    text = url_or_arn.strip()
    if text.startswith("arn:"):
        parts = text.split(":")
        return (parts[3], parts[4], parts[5]) if len(parts) == 6 else ("", "", text)
    path = text.rstrip("/").split("/")
    host = path[2] if len(path) >= 5 and "://" in text else ""
    labels = host.split(".")
    region = labels[1] if len(labels) > 2 and labels[0] == "sqs" else ""
    return (region, path[-2], path[-1]) if len(path) >= 5 else ("", "", text)


def _from_events_queue(record: Mapping[str, Any], events_queue: str) -> bool:
    """Whether a record came from ``BATCHRUN_EVENTS_QUEUE``: only those are read as SES
    events, so a body shaped like one on the retry queue suppresses nobody."""
    if not events_queue:
        return False
    source = _queue_id(str(record.get("eventSourceARN", "")))
    wanted = _queue_id(events_queue)
    if source[1:] != wanted[1:] or not wanted[2]:
        return False
    return not (source[0] and wanted[0]) or source[0] == wanted[0]


async def _mail_events(
    settings: Settings, registry: Registry, stop: StopToken, items: list[Received]
) -> tuple[list[dict[str, str]], float]:
    """Apply SES event records, each alone; those not applied (poison, or the database
    failed on them) are reported failed: retried, then moved by the redrive policy."""
    summary = mail_events.EventsSummary()
    topic = settings.environ.get("BATCHRUN_EVENTS_TOPIC", "").strip()
    async with open_backends(settings) as backends:
        runtime = make_runtime(registry, backends, settings, stop)
        async with RunRecord(runtime, kind="lambda") as record:
            applied = await mail_events.apply_items(backends.store, items, summary, topic=topic)
            await record.end(summary.exit_code, summary.to_json())
    log.info("SES events: %s", json.dumps(summary.to_json()))
    failed = [item for item, _ in applied.poison + applied.failed]
    return [{"itemIdentifier": item.message_id} for item in failed], float(len(items))


def _add(metrics: dict[str, float], verdict: Disposition) -> None:
    if verdict.summary is not None:
        for key, value in summary_metrics(verdict.summary).items():
            metrics[key] = metrics.get(key, 0) + value
    elif verdict.not_eligible:
        metrics["NotEligible"] = metrics.get("NotEligible", 0) + 1
    elif verdict.busy:  # given back: its backend was busy (no attempt)
        metrics["Busy"] = metrics.get("Busy", 0) + 1
    elif verdict.outcome is not None:
        name = {
            State.SUCCEEDED: "EmailsSent",
            State.RETRYING: "Failures",
            State.FAILED: "Failures",
        }.get(verdict.outcome, "UsersProcessed")
        metrics[name] = metrics.get(name, 0) + 1
        if verdict.outcome is State.SUCCEEDED:  # any job's; EmailsSent is kept for mail
            metrics["Succeeded"] = metrics.get("Succeeded", 0) + 1
        metrics["UsersProcessed"] = metrics.get("UsersProcessed", 0) + 1


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _attributes(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record's ``attributes``, or none when it has none that are an object."""
    found = record.get("attributes")
    return found if isinstance(found, Mapping) else {}

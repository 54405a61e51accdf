"""The AWS Lambda entry point: a thin adapter over the same jobs the CLI runs.

Events:
- EventBridge scheduled event: run the jobs in ``BATCHRUN_SCHEDULED_JOBS`` (default
  ``birthday``) for the period containing the event's ``time``.
- ``{"job": "renewal", "period": "2025-06-01", "dry_run": true}``: run one on demand
  (``"month"`` is read as the period too, as batchrun 0.1 wrote it).
- SQS event: process the records (retries, submitted tasks, continuations, shards) and
  report the ones that failed in ``{"batchItemFailures": [{"itemIdentifier": id}, ...]}``.
  A record from ``BATCHRUN_EVENTS_QUEUE`` (the events queue's ARN; its URL works too) is a
  bounce, complaint or other SES event (``batchrun.events.ses``), applied with the
  database alone, each record on its own; with ``BATCHRUN_EVENTS_TOPIC`` set, only SNS
  notifications from that topic. One that is no SES event, or is from another topic,
  fails alone, so the events queue's redrive policy moves it to its dead-letter queue.
  A body shaped like an SES event on any other queue is never applied: it is read as a
  retry message, and so is poison.
- HTTP event (a Function URL or an API Gateway HTTP API, payload 2.0) on
  ``BATCHRUN_UNSUBSCRIBE_URL/TOKEN``: POST suppresses the token's address (RFC 8058
  one-click, no login) and answers 200; GET answers a page with a confirm button; a bad
  token gets 400 and a page that names nobody (``batchrun.unsubscribe``).

Jobs come from ``BATCHRUN_JOBS`` (modules or .py files bundled in the zip), as for the CLI.

Before the deadline (``BATCHRUN_DEADLINE_MARGIN_MS``, default 10% of the time left at the
start, at least 500 ms) a run stops taking users, finishes those in flight and hands the
rest of the month on as a continuation message on ``BATCHRUN_RETRY_QUEUE``.

Event loop: each invocation runs in its own ``asyncio.run``. Lambda freezes the process
between invocations and may thaw it much later; a pool, client or lock created on an
earlier invocation's loop would be bound to a closed loop and to sockets the far end has
long dropped. So nothing loop-bound lives at module level: every connection is opened and
closed inside the invocation, and only plain data (settings) could be cached across them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from batchrun import unsubscribe
from batchrun.aws_secrets import database_url, forget
from batchrun.control.history import CANCELLED
from batchrun.control.runrecord import RunRecord
from batchrun.db.store import State
from batchrun.errors import BatchrunError, UsageError
from batchrun.events import ses as mail_events
from batchrun.period import Period, current
from batchrun.period import parse as parse_period
from batchrun.pipeline.apply import Disposition, settle_messages
from batchrun.pipeline.engine import Deadline, StopToken
from batchrun.queue.base import Received
from batchrun.registry import (
    SCHEDULED_BY_DEFAULT,
    Registry,
    builtin_modules,
    discover,
    parse_specs,
)
from batchrun.runtime import Options, Runtime, Summary
from batchrun.runtime.resources import open_backends
from batchrun.settings import Settings
from batchrun.urls import mask_text

log = logging.getLogger("batchrun")

NAMESPACE = "batchrun"
MIN_MARGIN_MS = 500


class LambdaContext(Protocol):
    """The part of Lambda's context object batchrun uses."""

    aws_request_id: str

    def get_remaining_time_in_millis(self) -> int: ...


def handler(event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Lambda entry point, configured by the same environment variables as the CLI."""
    return handle(event, context, environ=None)


def handle(
    event: Mapping[str, Any], context: LambdaContext, *, environ: Mapping[str, str] | None
) -> dict[str, Any]:
    """Handle one event with settings from ``environ`` (``os.environ`` when None)."""
    started = time.monotonic()
    request_id = getattr(context, "aws_request_id", "-")
    kind = "unknown"
    settings = Settings()
    try:
        settings = Settings.from_env(environ)
        kind = _kind(event)
        if kind == "http":  # answers every request itself, errors included
            result, metrics = asyncio.run(_http(event, settings, request_id))
            duration = time.monotonic() - started
            # Neither the page (it may name the address) nor the token goes to the log.
            _log_line("done", request_id, kind, duration_s=duration, http=result["statusCode"])
            _emit_metrics(kind, {**metrics, "Duration": duration * 1000})
            return result
        if settings.db_secret_arn:
            # Resolved before anything connects, so every error below is masked with it.
            url = asyncio.run(database_url(settings.db_secret_arn, settings.extra))
            settings = replace(settings, db_url=url)
        result, metrics = asyncio.run(_handle(event, context, settings, kind))
    except BatchrunError as exc:
        if settings.db_secret_arn:
            forget(settings.db_secret_arn)  # a rotated password is fetched afresh next time
        text = mask_text(str(exc), settings.db_url, settings.mail_url, settings.retry_queue_url)
        _log_line("error", request_id, kind, error=text, duration_s=time.monotonic() - started)
        raise BatchrunError(text) from None  # Lambda reports the one line; no secret in it
    duration = time.monotonic() - started
    _log_line("done", request_id, kind, duration_s=duration, result=result)
    _emit_metrics(kind, {**metrics, "Duration": duration * 1000})
    return result


def _kind(event: Mapping[str, Any]) -> str:
    if isinstance(event.get("Records"), list):
        return "sqs"
    request = event.get("requestContext")
    if isinstance(request, Mapping) and isinstance(request.get("http"), Mapping):
        return "http"
    if event.get("source") == "aws.events" or event.get("detail-type") == "Scheduled Event":
        return "schedule"
    if "job" in event:
        return "on_demand"
    raise UsageError(
        "unrecognised event: expected a schedule, an SQS batch, an HTTP request or {'job': ...}"
    )


async def _handle(
    event: Mapping[str, Any], context: LambdaContext, settings: Settings, kind: str
) -> tuple[dict[str, Any], dict[str, float]]:
    remaining = context.get_remaining_time_in_millis()
    margin = settings.deadline_margin_ms
    if margin is None:
        margin = max(MIN_MARGIN_MS, remaining // 10)
    stop = StopToken()
    watcher = asyncio.create_task(
        Deadline(context.get_remaining_time_in_millis, margin).watch(stop)
    )
    # In-flight sends get 70% of the margin to finish (a send cut off then may have been
    # accepted: the one duplicate window); the rest is for recording and the hand-off.
    options = Options(
        concurrency=settings.concurrency,
        rate=settings.rate,
        handoff=True,
        grace_s=max(0.1, margin * 0.7 / 1000),
    )
    registry: Registry | None = None
    try:
        registry = discover(
            parse_specs(settings.jobs), builtins=builtin_modules(settings.builtin_jobs)
        )
        if kind == "sqs":
            return await _sqs(event, settings, registry, stop, options)
        runs, dry_run = _runs_of(event, kind, registry, settings)
        async with open_backends(
            settings,
            mail=not dry_run,
            queue=not dry_run,
            concurrency=options.concurrency,
            jobs=[registry.get_job(name) for name, _ in runs],
        ) as backends:
            runtime = _runtime(registry, backends, settings, stop)
            summaries = [
                await _run(runtime, name, period, options, dry_run) for name, period in runs
            ]
        metrics: dict[str, float] = {}
        for summary in summaries:
            for key, value in _summary_metrics(summary).items():
                metrics[key] = metrics.get(key, 0) + value
        if len(summaries) == 1:
            return summaries[0].to_json(), metrics
        return {"runs": [summary.to_json() for summary in summaries]}, metrics
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if registry is not None:
            await _close_jobs(registry)


async def _run(
    runtime: Runtime, name: str, period: Period, options: Options, dry_run: bool
) -> Summary:
    """One run of the invocation, with its history row (none for a dry run)."""
    if dry_run:
        return await runtime.run(period, options, job=name, dry_run=True)
    async with RunRecord(runtime, kind="lambda", job=name, period=str(period)) as record:
        summary = await runtime.run(period, options, job=name)
        code = 130 if summary.stopped == CANCELLED else summary.exit_code
        await record.end(code, summary.to_json(), stopped=summary.stopped)
    return summary


async def _http(
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
        _log_line("error", request_id, "http", error=text)
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


async def _close_jobs(registry: Registry) -> None:
    """Let every job close what it opened on this invocation's loop (an HTTP client's
    sockets would otherwise stay open, bound to a closed loop, in a warm function)."""
    for entry in registry.values():
        try:
            await entry.job.aclose()
        except Exception as exc:
            log.warning("job %s could not close: %s", entry.job.name, exc)


def _runtime(registry: Registry, backends: Any, settings: Settings, stop: StopToken) -> Runtime:
    return Runtime(
        {name: entry.job for name, entry in registry.items()},
        backends.store,
        backends.mailer,
        backends.queue,
        settings,
        stop=stop,
        templates_dirs={name: entry.templates_dir for name, entry in registry.items()},
    )


def _runs_of(
    event: Mapping[str, Any], kind: str, registry: Registry, settings: Settings
) -> tuple[list[tuple[str, Period]], bool]:
    """(job, period) pairs the event asks for, and whether it is a dry run."""
    if kind == "schedule":
        when = str(event.get("time", ""))
        try:
            moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(f"scheduled event has no usable time: {when!r}") from None
        names = parse_specs(settings.scheduled_jobs) or list(SCHEDULED_BY_DEFAULT)
        return [(n, current(registry.get_job(n).period, moment)) for n in names], False
    name = event.get("job")
    if not isinstance(name, str):
        raise UsageError(f"unknown job {name!r}: known jobs are {', '.join(registry)}")
    job = registry.get_job(name)
    text = event.get("period", event.get("month"))
    try:
        period = current(job.period) if text is None else parse_period(job.period, str(text))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dry_run = event.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise UsageError(f"dry_run must be true or false, got {dry_run!r}")
    return [(name, period)], dry_run


async def _sqs(
    event: Mapping[str, Any],
    settings: Settings,
    registry: Registry,
    stop: StopToken,
    options: Options,
) -> tuple[dict[str, Any], dict[str, float]]:
    records = [r for r in event["Records"] if isinstance(r, Mapping)]
    items = [
        Received(
            message_id=str(r.get("messageId", "")),
            receipt=str(r.get("receiptHandle", "")),
            body=str(r.get("body", "")),
            receive_count=_int(r.get("attributes", {}).get("ApproximateReceiveCount"), 1),
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
        runtime = _runtime(registry, backends, settings, stop)
        async with RunRecord(runtime, kind="lambda") as record:
            await runtime.requeue_unqueued()
            dispositions = await runtime.process(items, options)
            failed = sum(1 for v in dispositions.values() if v.action != "delete")
            await record.end(3 if failed else 0, {"messages": len(items), "failed": failed})
        for item in items:
            disposition = dispositions.get(item.message_id, Disposition("later"))
            _add(metrics, disposition)
            if disposition.unknown_job is not None:
                # Not this function's job (BATCHRUN_JOBS): left for one that knows it.
                metrics["UnknownJob"] = metrics.get("UnknownJob", 0) + 1
        # The one applier the CLI uses too; a dead record goes straight to the DLQ and
        # succeeds, poison fails (the queue's redrive policy dead-letters it).
        unsettled = await settle_messages(backends.queue, items, dispositions, event_source=True)
        failures += [{"itemIdentifier": item.message_id} for item in unsettled]
    metrics["Failures"] = len(failures)
    return {"batchItemFailures": failures}, metrics


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
        runtime = _runtime(registry, backends, settings, stop)
        async with RunRecord(runtime, kind="lambda") as record:
            applied = await mail_events.apply_items(backends.store, items, summary, topic=topic)
            await record.end(summary.exit_code, summary.to_json())
    log.info("SES events: %s", json.dumps(summary.to_json()))
    failed = [item for item, _ in applied.poison + applied.failed]
    return [{"itemIdentifier": item.message_id} for item in failed], float(len(items))


def _add(metrics: dict[str, float], verdict: Disposition) -> None:
    if verdict.summary is not None:
        for key, value in _summary_metrics(verdict.summary).items():
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


def _summary_metrics(summary: Summary) -> dict[str, float]:
    return {
        "UsersProcessed": summary.eligible,
        "CardsCreated": summary.counters.get("cards_created", 0),
        "Succeeded": summary.succeeded,
        "EmailsSent": summary.emails_sent,
        "Failures": summary.failed,
        "Throttles": float(getattr(summary, "throttles", 0)),
    }


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _log_line(status: str, request_id: str, kind: str, **fields: Any) -> None:
    """One JSON line per event, with the request id (CloudWatch Logs Insights reads it)."""
    record = {
        "level": "ERROR" if status == "error" else "INFO",
        "status": status,
        "request_id": request_id,
        "event": kind,
        **fields,
    }
    print(json.dumps(record, default=str), file=sys.stdout, flush=True)


def _emit_metrics(kind: str, metrics: Mapping[str, float]) -> None:
    """CloudWatch Embedded Metric Format: one JSON line that CloudWatch turns into metrics."""
    units = {"Duration": "Milliseconds"}
    document: dict[str, Any] = {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [["event"]],
                    "Metrics": [{"Name": k, "Unit": units.get(k, "Count")} for k in metrics],
                }
            ],
        },
        "event": kind,
        **metrics,
    }
    print(json.dumps(document), file=sys.stdout, flush=True)

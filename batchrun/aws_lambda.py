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

Event loop: each invocation runs in a loop of its own (``runtime/event_loop.py``: uvloop's
when it is installed, else asyncio's; the zip of deploy/build_lambda.py has no uvloop).
Lambda freezes the process between invocations and may thaw it much later; a pool, client
or lock created on an earlier invocation's loop would be bound to a closed loop and to
sockets the far end has long dropped. So nothing loop-bound lives at module level: every
connection is opened and closed inside the invocation, and only plain data (settings)
could be cached across them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from batchrun.aws.http_event import handle_http
from batchrun.aws.invocation import (
    close_jobs,
    emit_metrics,
    log_line,
    make_runtime,
    summary_metrics,
)
from batchrun.aws.sqs_event import handle_sqs
from batchrun.aws_secrets import database_url, forget
from batchrun.control.history import CANCELLED
from batchrun.control.runrecord import RunRecord
from batchrun.errors import BatchrunError, UsageError
from batchrun.period import Period, current
from batchrun.period import parse as parse_period
from batchrun.pipeline.engine import Deadline, StopToken
from batchrun.registry import (
    SCHEDULED_BY_DEFAULT,
    Registry,
    builtin_modules,
    discover,
    parse_specs,
)
from batchrun.runtime import Options, Runtime, Summary, event_loop
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
            result, metrics = event_loop.run(
                handle_http(event, settings, request_id), settings.event_loop
            )
            duration = time.monotonic() - started
            # Neither the page (it may name the address) nor the token goes to the log.
            log_line("done", request_id, kind, duration_s=duration, http=result["statusCode"])
            emit_metrics(kind, {**metrics, "Duration": duration * 1000})
            return result
        if settings.db_secret_arn:
            # Resolved before anything connects, so every error below is masked with it.
            url = event_loop.run(
                database_url(settings.db_secret_arn, settings.extra), settings.event_loop
            )
            settings = replace(settings, db_url=url)
        result, metrics = event_loop.run(
            _handle(event, context, settings, kind), settings.event_loop
        )
    except BatchrunError as exc:
        if settings.db_secret_arn:
            forget(settings.db_secret_arn)  # a rotated password is fetched afresh next time
        text = mask_text(str(exc), settings.db_url, settings.mail_url, settings.retry_queue_url)
        log_line("error", request_id, kind, error=text, duration_s=time.monotonic() - started)
        raise BatchrunError(text) from None  # Lambda reports the one line; no secret in it
    duration = time.monotonic() - started
    log_line("done", request_id, kind, duration_s=duration, result=result)
    emit_metrics(kind, {**metrics, "Duration": duration * 1000})
    return result


def _kind(event: Mapping[str, Any]) -> str:
    if not isinstance(event, Mapping):
        raise UsageError(f"unrecognised event: expected a JSON object, got {type(event).__name__}")
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
    remaining = _remaining_ms(context)
    margin = settings.deadline_margin_ms
    if margin is None:
        margin = max(MIN_MARGIN_MS, remaining // 10)
    stop = StopToken()
    watcher = asyncio.create_task(Deadline(lambda: _remaining_ms(context), margin).watch(stop))
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
            return await handle_sqs(event, settings, registry, stop, options)
        runs, dry_run = _runs_of(event, kind, registry, settings)
        async with open_backends(
            settings,
            mail=not dry_run,
            queue=not dry_run,
            concurrency=options.concurrency,
            jobs=[registry.get_job(name) for name, _ in runs],
        ) as backends:
            runtime = make_runtime(registry, backends, settings, stop)
            summaries = [
                await _run(runtime, name, period, options, dry_run) for name, period in runs
            ]
            if kind == "schedule" and backends.queue is not None and not stop.stopping:
                # A lost task nothing waits behind is found on an empty queue only; where
                # an SQS trigger is all that runs, a quiet queue would wait for a message.
                await runtime.resend_lost_tasks(backends.queue, in_flight=0)
        metrics: dict[str, float] = {}
        for summary in summaries:
            for key, value in summary_metrics(summary).items():
                metrics[key] = metrics.get(key, 0) + value
        if len(summaries) == 1:
            return summaries[0].to_json(), metrics
        return {"runs": [summary.to_json() for summary in summaries]}, metrics
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if registry is not None:
            await close_jobs(registry)


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


def _remaining_ms(context: LambdaContext) -> int:
    """The invocation's time left; a context that cannot tell (None, not a number) is
    taken to have none left, so the work is handed on rather than cut off."""
    remaining = context.get_remaining_time_in_millis()
    if isinstance(remaining, bool) or not isinstance(remaining, int | float):
        return 0
    return int(remaining)


def _runs_of(
    event: Mapping[str, Any], kind: str, registry: Registry, settings: Settings
) -> tuple[list[tuple[str, Period]], bool]:
    """(job, period) pairs the event asks for, and whether it is a dry run."""
    if kind == "schedule":
        when = str(event.get("time", ""))
        try:
            moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
            if moment.year < 1900:  # as parse_period refuses on the other paths
                raise ValueError
        except ValueError:
            raise UsageError(f"scheduled event has no usable time: {when[:40]!r}") from None
        names = parse_specs(settings.scheduled_jobs) or list(SCHEDULED_BY_DEFAULT)
        return [(n, current(registry.get_job(n).period, moment)) for n in names], False
    name = event.get("job")
    if not isinstance(name, str):
        raise UsageError(f"unknown job {name!r}: known jobs are {', '.join(registry)}")
    job = registry.get_job(name)
    text = event.get("period")
    if text is None:  # "period": null names none: "month" (batchrun 0.1's name) may
        text = event.get("month")
    try:
        period = current(job.period) if text is None else parse_period(job.period, str(text))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dry_run = event.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise UsageError(f"dry_run must be true or false, got {dry_run!r}")
    return [(name, period)], dry_run

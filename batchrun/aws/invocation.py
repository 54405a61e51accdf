"""What every kind of Lambda invocation shares: its runtime over the jobs the registry
found, the jobs' own closing, and the two JSON lines it leaves in CloudWatch (a log line
and an Embedded Metric Format document)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

from batchrun.pipeline.engine import StopToken
from batchrun.pipeline.reports import Summary
from batchrun.registry import Registry
from batchrun.runtime import Runtime
from batchrun.settings import Settings

log = logging.getLogger("batchrun")

NAMESPACE = "batchrun"


def make_runtime(registry: Registry, backends: Any, settings: Settings, stop: StopToken) -> Runtime:
    return Runtime(
        {name: entry.job for name, entry in registry.items()},
        backends.store,
        backends.mailer,
        backends.queue,
        settings,
        stop=stop,
        templates_dirs={name: entry.templates_dir for name, entry in registry.items()},
    )


async def close_jobs(registry: Registry) -> None:
    """Let every job close what it opened on this invocation's loop (an HTTP client's
    sockets would otherwise stay open, bound to a closed loop, in a warm function)."""
    for entry in registry.values():
        try:
            await entry.job.aclose()
        except Exception as exc:
            log.warning("job %s could not close: %s", entry.job.name, exc)


def summary_metrics(summary: Summary) -> dict[str, float]:
    return {
        "UsersProcessed": summary.eligible,
        "CardsCreated": summary.counters.get("cards_created", 0),
        "Succeeded": summary.succeeded,
        "EmailsSent": summary.emails_sent,
        "Failures": summary.failed,
        "Throttles": float(getattr(summary, "throttles", 0)),
    }


def log_line(status: str, request_id: str, kind: str, **fields: Any) -> None:
    """One JSON line per event, with the request id (CloudWatch Logs Insights reads it)."""
    record = {
        "level": "ERROR" if status == "error" else "INFO",
        "status": status,
        "request_id": request_id,
        "event": kind,
        **fields,
    }
    print(json.dumps(record, default=str), file=sys.stdout, flush=True)


def emit_metrics(kind: str, metrics: Mapping[str, float]) -> None:
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

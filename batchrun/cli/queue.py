"""Commands that consume the queue: ``retry`` (drain once) and ``worker`` (until SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Annotated

import typer
from rich.markup import escape

from batchrun.cli.app import Invocation, app, error_text, rate_option, run_command
from batchrun.cli.conventions import examples, stderr
from batchrun.cli.output import ASKED, table
from batchrun.control.history import CANCELLED
from batchrun.control.runrecord import RunRecord
from batchrun.pipeline import engine
from batchrun.queue.base import WorkQueue
from batchrun.runtime import Options, RetrySummary
from batchrun.runtime.resources import open_backends, open_queue
from batchrun.settings import MAX_CONCURRENCY


@app.command(
    "worker",
    epilog=examples(
        "batchrun worker --concurrency 50 --rate 10",
        'batchrun worker --queue "$BATCHRUN_RETRY_QUEUE" --idle-exit 5',
    ),
)
def worker(
    ctx: typer.Context,
    queue_url: Annotated[
        str | None,
        typer.Option(
            "--queue",
            metavar="QUEUE_URL",
            help="The queue to consume (default: the --retry-queue). Use the same queue for "
            "both, so retries and hand-offs come back to the workers.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=MAX_CONCURRENCY)] = 20,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Emails per second at most for this worker, or 'auto'. It also caps each "
            "named backend's calls per second (Job.backends), the lower rate winning.",
        ),
    ] = None,
    prefetch: Annotated[
        int,
        typer.Option(
            "--prefetch",
            min=1,
            max=1000,
            help="Messages taken per receive and worked as one batch (SQS gives at most 10 a "
            "receive). Keep 1 where shards are consumed (each is big, and a batch's are run "
            "one after another); 50-100 on the local queue for submitted tasks (a batch's "
            "first tasks are claimed in a few statements whatever its size).",
        ),
    ] = 1,
    visibility: Annotated[
        float,
        typer.Option(
            "--visibility",
            min=1.0,
            max=43_200.0,  # SQS's longest visibility timeout: 12 hours
            help="Seconds a taken message stays hidden; extended while it is worked on.",
        ),
    ] = 120.0,
    idle_exit: Annotated[
        float | None,
        typer.Option(
            "--idle-exit",
            min=0.0,
            help="Exit after the queue stays empty this long (and every task this worker "
            "put back to wait for its entity's turn has come back; a retry's delay does "
            "not hold it).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON summary.")
    ] = False,
) -> None:
    """Consume the queue until SIGTERM: shards, retries, submitted tasks and continuations.

    For ECS, EC2 or any host; the SQS-triggered Lambda runs the same processing. A mail
    outage does not stop it: it backs off and polls on, and started while the mail server
    (or the queue) is down it waits for it (backoff up to 30 s, one log line per change)
    and then serves. SIGTERM finishes the entities in flight and hands the rest of a shard
    on. Messages for a job it does not know stay on the queue; at its end it exits 1 with
    one line naming the job (give its module with --jobs). The same error for
    BATCHRUN_BUG_THRESHOLD entities in a row (a bug in a job) stops it with exit 1. An
    entity whose named backend is busy waits up to BATCHRUN_BUSY_WAIT_S, then goes back to
    the queue with a growing delay (counted busy): no attempt, never dead-lettered for it.
    Finding the queue empty, it sends again the submitted tasks whose message was lost
    (never started BATCHRUN_TASK_RESEND_S after their submission; counted requeued).
    `batchrun cancel` of a job whose messages it worked stops it as SIGTERM would, exit
    130 (its supervisor's restart serves on: a cancel does not stop later runs).
    """
    context: Invocation = ctx.obj
    settings = context.settings
    pace = rate_option(rate)

    async def go() -> int:
        registry = context.registry
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        try:
            async with open_backends(
                settings,
                mail=True,
                queue=True,
                concurrency=concurrency,
                jobs=[e.job for e in registry.values()],
            ) as backends:
                assert backends.queue is not None
                consumed = backends.queue
                if queue_url is not None and queue_url != settings.retry_queue_url:
                    consumed = await open_queue(
                        settings, queue_url, backends.store, concurrency=concurrency
                    )
                try:
                    options = Options(concurrency=concurrency, rate=pace, handoff=True)
                    runtime = context.runtime(backends, stop)
                    async with RunRecord(runtime, kind="worker") as record:
                        options.on_progress = record.progress()
                        result = await runtime.serve(
                            consumed,
                            options,
                            prefetch=prefetch,
                            visibility_s=visibility,
                            idle_exit_s=idle_exit,
                        )
                        code = 1 if result.error is not None or result.unknown_job else 0
                        if code == 0 and stop.reason == CANCELLED:  # a job it worked
                            code = 130
                        await record.end(code, result.to_json(), stopped=stop.reason)
                finally:
                    if consumed is not backends.queue:
                        await consumed.close()
        finally:
            uninstall()
        if as_json:
            print(json.dumps(result.to_json()))
        else:
            table("worker", result.to_json(), always=ASKED)
        _say_lost(result.lost_claims)
        _say_unknown(result)  # a bug, or messages no process here can do: exit 1 wins
        if code == 130:
            stderr.print(
                "stopped (cancelled): the cancelled job's messages stay on the queue for the "
                "next worker",
                highlight=False,
            )
        return code

    run_command(ctx, go)


@app.command(
    "retry",
    epilog=examples(
        "batchrun retry",
        "batchrun retry --max 1000 --json",
    ),
)
def retry(
    ctx: typer.Context,
    max_messages: Annotated[
        int, typer.Option("--max", min=1, help="Most queue messages to process.")
    ] = 10_000,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=MAX_CONCURRENCY)] = 20,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate",
            help="Emails per second at most, or 'auto'. It also caps each named backend's "
            "calls per second (Job.backends), the lower rate winning.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON summary.")
    ] = False,
) -> None:
    """Drain the retry queue once: redo each failed entity, delete what succeeds.

    What fails again comes back later (exponential backoff); after the last attempt it is
    dead-lettered and listed by `batchrun status` and `batchrun dead list`. Counts are
    entities, not messages. A task whose entity the job's page does not return is dropped
    (not_eligible), the ledger left as it was. Messages for a job this process does not
    know stay on the queue (unknown_job) and the drain exits 1 naming it: give the job's
    module with --jobs (`batchrun --jobs myjobs.py retry`). An entity whose named backend
    is busy waits up to BATCHRUN_BUSY_WAIT_S, then goes back with a growing delay (counted
    busy, no attempt). At its end it sends again, and works, the submitted tasks whose
    message was lost (never started BATCHRUN_TASK_RESEND_S after their submission;
    counted requeued). Messages it leaves on the queue are counted remaining, with one
    line saying when the next is due (not yet: a retry's backoff; some due now: past
    --max). On an error, one `error:` line (and with --json the summary, its
    counts at 0 but remaining, the messages still queued (null when the queue was not
    opened or cannot tell), with an "error" key), exit 1.
    """
    context: Invocation = ctx.obj
    settings = context.settings
    pace = rate_option(rate)

    async def go() -> int:
        began = time.monotonic()
        registry = context.registry
        stop = engine.StopToken()
        uninstall = engine.install_signal_handlers(asyncio.get_running_loop(), stop)
        remaining: int | None = None  # the queue's depth, when the drain ends on an error
        reached = RetrySummary()  # what the drain did, should it end on an error
        try:
            async with open_backends(
                settings,
                mail=True,
                queue=True,
                concurrency=concurrency,
                jobs=[e.job for e in registry.values()],
            ) as backends:
                try:
                    runtime = context.runtime(backends, stop)
                    async with RunRecord(runtime, kind="retry") as record:
                        options = Options(
                            concurrency=concurrency, rate=pace, on_progress=record.progress()
                        )
                        result = await runtime.retry(
                            options, max_messages=max_messages, result=reached
                        )
                        code = 130 if stop.stopping else result.exit_code
                        waiting = _left_waiting(result) and not stop.stopping
                        due = await _next_due(backends.queue) if waiting else None
                        await record.end(code, result.to_json(), stopped=stop.reason)
                except Exception:
                    remaining = await _depth(backends.queue)
                    raise
        except Exception as exc:
            if as_json:  # the drain ended on an error: what it did (the line follows)
                reached.duration_s = time.monotonic() - began
                ended = reached.to_json()
                ended["remaining"] = remaining
                print(json.dumps({**ended, "error": error_text(context, exc)}))
            raise
        finally:
            uninstall()
        if as_json:
            print(json.dumps(result.to_json()))
        else:
            table("retry", result.to_json(), always=ASKED)
        _say_lost(result.lost_claims)
        if stop.stopping:
            stderr.print(
                f"stopped ({stop.reason}); {result.remaining} messages left for the next retry",
                highlight=False,
            )
        else:
            _say_unknown(result)
            if waiting:
                _say_not_due(result.remaining, due)
        return code

    run_command(ctx, go)


def _left_waiting(result: RetrySummary) -> bool:
    """Whether the messages the drain left on the queue only wait to be due: not those of
    a drain a bug stopped, or with messages of unknown or paused jobs among them (their
    own lines say what they wait for)."""
    return bool(result.remaining) and not (result.error or result.unknown_job or result.paused)


async def _next_due(queue: WorkQueue | None) -> float | None:
    """Seconds until the queue's next waiting message is due; None when it cannot tell."""
    if queue is None:
        return None
    try:
        return await queue.next_due_s()
    except Exception:
        return None


def _say_not_due(remaining: int, due: float | None) -> None:
    """The line for the messages a drain left on the queue: not due yet (a retry's
    backoff, or another consumer holding them), or not reached (--max)."""
    if due is None:
        state = " (the queue does not say when they are due)"
    elif due > 0:
        state = f", not due yet: the next in {max(1, math.ceil(due))} s"
    else:
        state = ", some due now"
    stderr.print(
        f"{remaining} message{'s' if remaining != 1 else ''} left on the queue{state}; "
        "a later `batchrun retry`, or a `batchrun worker` left running, works them",
        highlight=False,
    )


async def _depth(queue: WorkQueue | None) -> int | None:
    """The messages on the queue, for the summary of a drain that ended on an error once
    the queue was open; None when the queue cannot tell (it may be what failed)."""
    if queue is None:
        return None
    try:
        depth, _ = await queue.depths()
    except Exception:
        return None
    return depth


def _say_unknown(result: RetrySummary) -> int:
    """The line naming jobs whose messages were left on the queue, or the bug that stopped
    the drain; 1 if there was one."""
    line = result.error or result.unknown_line()
    if line is None:
        return 0
    stderr.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return 1


def _say_lost(lost_claims: int) -> None:
    """The line `run` prints too: claims another run took over while this one was stalled."""
    if lost_claims:
        stderr.print(
            f"{lost_claims} claims were taken over by another run while this one could not "
            "renew them; that run does them",
            highlight=False,
        )

"""One entity's story: what batchrun knows of it, in time order (``batchrun why`` and the
dashboard's entity page both tell it from here).

Nothing is claimed, written or sent. The story is put together from what is stored:

- eligible now: the job's page returns the entity, its address is valid and not on the
  suppression list (the checks a run makes before it acts);
- the ledger row of the entity's ``once_per`` period: state, attempts, the last error, the
  claim; a succeeded entity's Message-ID (stable per key) and when it was accepted, if an
  email went out (``_emailed``: the ledger does not say; the run history's counts do);
- bounces and complaints (the row's ``mail_event``) and the suppression list's entry for the
  address (unsubscribes, bounces, complaints, manual);
- the local queue's messages for the entity in the same ``once_per`` period (a task job's:
  all), waiting or dead-lettered (an SQS queue cannot be read without receiving: the
  ledger's ``queued`` flag stands in for it). A message keeps the reason it was queued
  for while later attempts fail: once received, that reason is told at the time it was
  queued, and the message's state now apart;
- the run that did each step: the ledger's ``run_id`` (the run that claimed it), else the
  run history's run of the job going on at that moment.

A task job's entity has no page and no ledger row: its submitted tasks tell its story
instead (control/task_story.py), with its queue messages and the runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any

from batchrun.control.history import SERVING, History, RunRow
from batchrun.control.task_story import NOT_BY_A_RUN, task_events
from batchrun.control.timeline import Event, iso
from batchrun.db.store import FINAL_STATES, State
from batchrun.effects.lender import NoEffects
from batchrun.job import Context, Job
from batchrun.mail.base import valid_address
from batchrun.period import Period, parse
from batchrun.pipeline.pager import recheck
from batchrun.queue.local import LocalQueue
from batchrun.task import is_task

if TYPE_CHECKING:
    from batchrun.pipeline.wiring import Wiring

STATE_NAMES = {0: "pending", 1: "sent", 2: "skipped", 3: "retrying", 4: "failed"}
MAX_MESSAGES = 100  # queue messages read for one entity (there is one retry at a time)
JOB_RUNS = 20  # a job's newest runs asked whether its successes send email

# (job, epoch ms) -> the id of the run of that job going on at that moment, if known.
RunFinder = Callable[[str, int], Awaitable[int | None]]


@dataclass(slots=True)
class Story:
    """An entity's story for one job and period."""

    job: str
    entity_id: int
    period: str
    eligible: bool
    state: str | None  # the ledger state's name; None: no run has touched it
    events: list[Event] = field(default_factory=list)
    of_tasks: bool = False  # a task job's: ``state`` is its current task's (task_story.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "entity_id": self.entity_id,
            "period": self.period,
            "eligible": self.eligible,
            "state": self.state,
            "events": [e.to_json() for e in self.events],
        }


def message_id(job: Job, key: str, sender: str) -> str:
    """The Message-ID batchrun gives the entity's email (effects/sending.py's formula);
    ``sender`` is the job's From (``Settings.sender_for``)."""
    domain = parseaddr(sender)[1].rpartition("@")[2]
    return f"<{key.replace(':', '.')}@{domain or 'localhost'}>"


async def tell(
    w: Wiring, job: Job, period: Period, entity_id: int, *, runs_at: RunFinder | None = None
) -> Story:
    """The story of ``entity_id`` for ``job``'s ``period``; reads only."""
    serving = SERVING if is_task(job) else None  # not an events drain, say
    finder = runs_at or await history_finder(w, serving=serving)
    if is_task(job):
        now = await w.store.db.clock_ms()  # the server's, which every time stored is on
        eligible, task_state, steps = await task_events(w.store.db, job.name, entity_id, now)
        steps += await _queue_events(w, job, entity_id, None, now)
        steps = await _with_runs(job, steps, finder)
        return Story(job.name, entity_id, str(period), eligible, task_state, steps, of_tasks=True)
    ctx = Context(job, period, w.store.jobdb, NoEffects(w.store), dry_run=True)
    ctx = ctx.entity(entity_id)
    now = await w.store.db.clock_ms()  # leases are compared with it
    events: list[Event] = []
    eligible, address, why_not = await _eligibility(w, job, ctx, entity_id)
    state: str | None = None
    row = await w.store.db.fetchone("story_ledger", job=job.name, once=str(ctx.once), id=entity_id)
    if row is None:
        events.append(Event(now, "no ledger row", f"no run has claimed it for {ctx.once}"))
    else:
        state = STATE_NAMES.get(int(row[1]), str(row[1]))
        emailed = None
        if int(row[1]) == State.SUCCEEDED:
            emailed = await _emailed(w, job, row, finder)
        steps = _ledger_events(w, job, ctx, row, now, emailed)
        events += steps
        if eligible and int(row[1]) in FINAL_STATES:
            how = steps[0].what  # sent (an email went out), succeeded, skipped or failed
            eligible, why_not = False, f"finished for {ctx.once} ({how}): runs leave it"
    events.append(Event(now, "eligible now" if eligible else "not eligible now", why_not))
    if address is not None:
        events += await _suppression_events(w, address)
    events += await _queue_events(w, job, entity_id, ctx.once, now)
    events = await _with_runs(job, events, finder)
    return Story(job.name, entity_id, str(period), eligible, state, events)


async def _with_runs(job: Job, events: list[Event], finder: RunFinder) -> list[Event]:
    """The events in time order (what is true now first among those of a moment), each
    step a process took with the run that took it."""
    events = [
        Event(e.at, e.what, e.detail, await finder(job.name, e.at))
        if e.run_id is None and _by_a_run(e)
        else e
        for e in events
    ]
    events.sort(key=lambda e: (e.at, e.what != "eligible now" and e.what != "not eligible now"))
    return events


def _by_a_run(event: Event) -> bool:
    """Steps a process recorded in the run history takes: outcomes, queue messages, and
    bounces and complaints (an ``events`` drain). Not the look-ups made now, nor an
    unsubscribe or a manual suppression (a person's doing)."""
    return not event.current and event.what not in (
        "eligible now",
        "not eligible now",
        "no ledger row",
        "unsubscribed",
        "suppressed (manual)",
        *NOT_BY_A_RUN,
    )


async def history_finder(
    w: Wiring, limit: int = 1000, *, serving: tuple[str, ...] | None = None
) -> RunFinder:
    """The run of a job (or a process serving every job: with ``serving``, only one of
    those kinds) going on at a moment, from the newest ``limit`` rows of the run history."""
    runs = await History(w.store.db, lease_s=w.settings.lease_s).runs(limit=limit)

    def of(run: RunRow, job: str) -> bool:
        if run.job is not None:
            return run.job == job
        return serving is None or run.kind in serving

    async def find(job: str, at: int) -> int | None:
        for run in runs:  # newest first: the innermost of overlapping runs wins
            end = run.ended_at if run.ended_at is not None else run.heartbeat_at
            if of(run, job) and run.started_at <= at <= end:
                return run.id
        return None

    return find


async def _eligibility(
    w: Wiring, job: Job, ctx: Context, entity_id: int
) -> tuple[bool, str | None, str]:
    """Whether a run would act on the entity now, its address, and why not."""
    row = await recheck(job, ctx, entity_id)
    if row is None:
        return False, None, "the job's page does not return it now"
    column = job.address  # None: the job sends no email
    address = row.get(column) if column is not None else None
    if column is None or not isinstance(address, str):
        return True, None, "the job's page returns it"
    if not valid_address(address):
        return False, address, f"invalid address in {column}"
    reason = (await w.store.suppressed([address])).get(address)
    if reason is not None:
        return False, address, f"suppressed: {reason}"
    return True, address, "the job's page returns it; the address is valid and not suppressed"


async def _emailed(w: Wiring, job: Job, row: Sequence[Any], finder: RunFinder) -> bool | None:
    """Whether the success of a succeeded ledger row sent an email: True, False, or None
    when nothing stored says.

    The ledger's state says only "succeeded" (``State.SENT`` is its old name, for every
    job). A bounce or a complaint noted on the row is one email's; else the run history's
    counts: those of the run that finished it (the row's ``run_id``, else the job's run
    going on then), else those of the job's newest runs, if they agree.
    """
    if row[8] is not None:  # mail_event: the provider reported on its email
        return True
    history = History(w.store.db, lease_s=w.settings.lease_s)
    run_id = int(row[9]) if row[9] is not None else await finder(job.name, int(row[7]))
    run = None if run_id is None else await history.get(run_id)
    known = None if run is None else _run_emailed(run)
    if known is not None:
        return known
    said = {_run_emailed(r) for r in await history.runs(job.name, limit=JOB_RUNS)} - {None}
    return said.pop() if len(said) == 1 else None


def _run_emailed(run: RunRow) -> bool | None:
    """Whether a run's successes sent email, by its counts: False when it sent none though
    it succeeded, True when it sent as many as it succeeded, None when it sent fewer (a job
    that emails some entities) or its counts do not tell (a retry drain counts no emails)."""
    counts = run.counts or {}
    sent, done = counts.get("emails_sent"), counts.get("succeeded")
    if not isinstance(sent, int) or not isinstance(done, int) or done <= 0:
        return None
    if sent == 0:
        return False
    return True if sent >= done else None


def _ledger_events(
    w: Wiring, job: Job, ctx: Context, row: Sequence[Any], now: int, emailed: bool | None
) -> list[Event]:
    """The ledger row as steps: its state at its last change, and a bounce or complaint.
    ``emailed``: whether a succeeded row's success sent an email (None: not known)."""
    period, state, attempts, owner, lease_until = row[0], int(row[1]), int(row[2]), row[3], row[4]
    queued, error, updated, mail_event = bool(row[5]), row[6], int(row[7]), row[8]
    run = None if row[9] is None else int(row[9])  # the run that claimed it last
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    out: list[Event] = []
    if state == State.SUCCEEDED:
        mid = message_id(job, ctx.key, w.settings.sender_for(job))
        if emailed:
            detail = f"Message-ID {mid} accepted ({tries}; period {period})"
            out.append(Event(updated, "sent", detail, run))
        elif emailed is False:
            detail = f"{tries}; period {period}; no email sent (the run history counts none)"
            out.append(Event(updated, "succeeded", detail, run))
        else:  # "sent", as it always said: only the history's "none" says otherwise
            detail = f"Message-ID {mid}, if it sent an email ({tries}; period {period})"
            out.append(Event(updated, "sent", detail, run))
    elif state == State.SKIPPED:
        out.append(Event(updated, "skipped", error or "skipped", run))
    elif state == State.RETRYING:
        waits = "a retry message is queued" if queued else "no retry message queued yet"
        out.append(Event(updated, "retrying", f"{tries}, last error: {error or '?'}; {waits}", run))
    elif state == State.FAILED:
        out.append(Event(updated, "failed", f"for good after {tries}: {error or '?'}", run))
    elif owner is not None and lease_until is not None and int(lease_until) > now:
        out.append(Event(updated, "claimed", f"a run holds it ({tries} before this one)", run))
    else:
        left = f"; last error: {error}" if error else ""
        out.append(Event(updated, "pending", f"claimed once, not finished ({tries}{left})", run))
    if mail_event in ("bounce", "complaint"):
        out.append(Event(updated, mail_event, "reported by the mail provider for this email"))
    return out


async def _suppression_events(w: Wiring, address: str) -> list[Event]:
    entry = await w.store.suppression(address)
    if entry is None:
        return []
    what = "unsubscribed" if entry.reason == "unsubscribe" else f"suppressed ({entry.reason})"
    source = f" from {entry.source}" if entry.source else ""
    return [Event(entry.created_at, what, f"the address is on the suppression list{source}")]


async def _queue_events(
    w: Wiring, job: Job, entity_id: int, once: Period | None, now: int
) -> list[Event]:
    """The local queue's messages for the entity (retries and tasks): for a job with
    periods, those of the ledger row told (``once``: its ``once_per`` period) alone."""
    if not isinstance(w.queue, LocalQueue):
        return []
    rows = await w.store.db.fetchall(
        "story_queue",
        job_like=f'%"job":"{job.name}"%',
        id_like=f'%"id":{entity_id},%',
        limit=MAX_MESSAGES,
    )
    out: list[Event] = []
    for message_id_, body, visible_at, receives, dead, dead_reason, created in rows:
        try:
            data = json.loads(body)
        except ValueError:
            continue
        named = data.get("id", data.get("user_id")) if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("job") != job.name or named != entity_id:
            continue
        period, key = data.get("period") or data.get("month"), data.get("key")
        if once is not None and _once_of(job, period) != once:
            continue  # another period's: its own ledger row's story
        kind = data.get("kind", "retry")
        reason = data.get("reason") or ""
        if dead:
            detail = f"message {message_id_} ({kind}): {dead_reason or reason or '?'}"
            # visible_at: when it died (queue_dead_letter); created: when it was queued
            out.append(Event(max(int(created), int(visible_at)), "dead-lettered", detail))
            continue
        of = f"{kind}, key {key}" if key else f"{kind}, period {period}"
        waiting = f"message {message_id_} ({of}), received {receives} times, visible from "
        waiting += iso(int(visible_at))
        if reason and int(receives) > 0:
            # Received since it was queued, and hidden again after a failure: its body still
            # has the reason of the attempt that queued it (the ledger has the last error).
            attempt = data.get("attempt")
            after = f" after attempt {attempt}" if isinstance(attempt, int) else ""
            detail = f"message {message_id_} ({of}) queued{after}: {reason}"
            out.append(Event(int(created), f"{kind} message queued", detail))
            out.append(Event(now, f"{kind} message waiting", waiting, current=True))
        else:
            detail = waiting + (f"; reason: {reason}" if reason else "")
            out.append(Event(int(created), f"{kind} message waiting", detail))
    return out


def _once_of(job: Job, period: object) -> Period | None:
    """The ``once_per`` period (the ledger row's) of a message's period; None if it has none."""
    if not isinstance(period, str):
        return None
    try:
        return parse(job.period, period).within(job.once_unit())
    except ValueError:
        return None

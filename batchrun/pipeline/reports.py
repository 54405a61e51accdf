"""What a run, a queue drain and a fan-out report: the contract's JSON summaries."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from batchrun.db.store import State

log = logging.getLogger(__name__)

MAX_REASONS = 100  # distinct failure reasons a run keeps for its summary
OTHER_REASONS = "other reasons (`batchrun status` lists each entity's)"


class _Report:
    """The JSON form every result shares: its fields, the duration rounded to a millisecond."""

    duration_s: float

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        data["duration_s"] = round(self.duration_s, 3)
        return dict(data)


def mail_down(stopped: str | None) -> bool:
    """Whether a run's ``stopped`` says the mail backend did not answer: its circuit breaker
    opened (``mail backend unreachable ...``), or its check before the run found it down
    (``mail: cannot connect to ...``)."""
    return stopped is not None and stopped.startswith("mail")


@dataclass
class Summary(_Report):
    """The result of one run of a job over a period (or a range of it)."""

    job: str
    period: str
    dry_run: bool
    eligible: int = 0  # entities this run selected (claimed, or counted in a dry run)
    succeeded: int = 0
    skipped: int = 0
    failed: int = 0
    queued_for_retry: int = 0
    dead_lettered: int = 0
    emails_sent: int = 0  # accepted by the mail backend in this run
    not_queued: int = 0  # temporary failures the retry queue did not take (kept in the ledger)
    left_pending: int = 0  # claimed but not worked on when the run stopped (released)
    lost_claims: int = 0  # entities whose claim another run took over (not done by this one)
    # entities whose job statement lost its reply (applied or not): retried as a whole
    unknown_outcome: int = 0
    # entities worked (their effects done) whose outcome the run did not see written before
    # it ended on an error or a stop: a rerun works again any the ledger does not have
    unrecorded: int = 0
    continuation: bool = False  # the rest of the period was handed on through the queue
    stopped: str | None = None
    throttles: int = 0  # sends the provider throttled (slowed down and sent again)
    send_rate: float | None = None  # the pace the adaptive rate settled at (sends/s)
    send_rate_peak: float | None = None
    db_paused_s: float = 0.0  # time spent waiting for the database's load (--max-db-load)
    duration_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)  # the job's ctx.count names
    month: str | None = None  # a month job's period, under the name batchrun 0.1 used
    error: str | None = None  # why the run ended on an error (a bug in the job), one line
    paused: bool = False  # the job was paused (`batchrun pause`): the run did nothing
    # the job's named backends: {name: {calls, throttles, busy_waits, rate}} (no key when
    # it declares none)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    # why entities failed in this run, reason -> entities: for the summary a person reads
    # (the most common few), not in the JSON, whose keys are the contract's
    failure_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 all done; 3 some entities wait for a retry (or could not be queued), or the
        mail backend was down and the period (or its rest) waits in the queue as a
        continuation; 1 the run stopped on an error (``error``)."""
        if self.error is not None:
            return 1
        if self.queued_for_retry or self.not_queued:
            return 3
        # A deadline's or a signal's hand-off is no failure: only a mail outage's counts.
        return 3 if self.continuation and mail_down(self.stopped) else 0

    def count(self, name: str, n: int) -> None:
        # Never raises: a count comes after the job's effects (an email sent), and an
        # error here would have the entity retried and the email sent again.
        key = counter_key(name)
        self.counters[key] = self.counters.get(key, 0) + n

    def failed_for(self, reason: str, n: int = 1) -> None:
        """``n`` entities failed (for a retry or for good) for ``reason``; past
        ``MAX_REASONS`` distinct ones (a refusal naming each recipient, say), the rest
        count as one "other reasons", so memory does not grow with the period."""
        self.failed += n
        reasons = self.failure_reasons
        if reason not in reasons and len(reasons) >= MAX_REASONS:
            reason = OTHER_REASONS
        reasons[reason] = reasons.get(reason, 0) + n

    def common_failures(self, most: int = 3) -> list[tuple[str, int]]:
        """The ``most`` commonest reasons entities failed in this run, commonest first."""
        return sorted(self.failure_reasons.items(), key=lambda kv: -kv[1])[:most]

    def __getattr__(self, name: str) -> int:
        """A job's counter as an attribute: ``summary.cards_created``."""
        counters = self.__dict__.get("counters")
        if counters is not None and name in counters:
            return int(counters[name])
        raise AttributeError(name)

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        counters = data.pop("counters")
        del data["failure_reasons"]
        if data["month"] is None:
            del data["month"]
        if data["error"] is None:
            del data["error"]
        if not data["paused"]:
            del data["paused"]  # shown only when true
        if not data["backends"]:
            del data["backends"]
        data.update(counters)
        return data


# The keys of a run's JSON summary, which a job's counter may not take.
SUMMARY_KEYS = frozenset(f.name for f in fields(Summary)) - {"counters", "failure_reasons"}
_told: set[str] = set()  # counter names said to be renamed, once a process


def counter_key(name: str) -> str:
    """The summary key of the job's counter ``name``: the name itself, or ``job_NAME``
    for a name the summary has (``failed``: it overwrote the run's own count in the JSON
    scripts read), said once in a warning."""
    if name not in SUMMARY_KEYS:
        return name
    key = f"job_{name}"
    if name not in _told:
        _told.add(name)
        log.warning("the job's counter %r is a key of the run's summary: reported as %r", name, key)
    return key


def counter_names(counters: object) -> tuple[str, ...]:
    """A job's ``counters`` as names: a lone string is one name (``"pings"`` counted p,
    i, n, g and s)."""
    if isinstance(counters, str):
        return (counters,)
    return tuple(str(c) for c in counters)  # type: ignore[attr-defined]


@dataclass
class RetrySummary(_Report):
    """The result of one drain of the queue (or a worker's life): counted in entities.

    ``processed == succeeded + skipped + failed + poison`` (poison: messages that named no
    entity, dead-lettered unworked).
    """

    processed: int = 0
    succeeded: int = 0
    skipped: int = 0
    failed: int = 0
    poison: int = 0
    dead_lettered: int = 0
    remaining: int = 0
    requeued: int = 0  # ledger failures whose retry message was re-sent, lost tasks sent again
    lost_claims: int = 0
    not_eligible: int = 0  # tasks and retries whose entity the page does not return: dropped
    unknown_job: int = 0  # messages for jobs this process does not know: left on the queue
    unknown_outcome: int = 0  # entities whose job statement lost its reply: retried later
    duration_s: float = 0.0
    unknown_jobs: set[str] = field(default_factory=set)  # their names (not in the JSON)
    error: str | None = None  # why the drain stopped on an error (a bug in a job)
    # why it stopped before its end: "cancelled" (`batchrun cancel`), a signal (no key when
    # it did not)
    stopped: str | None = None
    busy: int = 0  # entities given back to the queue because their backend was busy
    # the named backends called: {name: {calls, throttles, busy_waits, rate}} (no key when
    # none was)
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    # when (time.monotonic()) the last task this process put back to wait for its entity's
    # turn comes back: a worker's --idle-exit waits past it (not in the JSON)
    waiting_until: float = 0.0
    # messages of paused jobs given back unworked: no work, so no end to a worker's idle
    # time (not in the JSON)
    paused: int = 0

    @property
    def exit_code(self) -> int:
        """1 when it stopped on a bug, or messages wait for a job this process does not
        know (give its --jobs); 3 when some entities failed; else 0."""
        if self.unknown_job or self.error is not None:
            return 1
        return 3 if self.failed else 0

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        del data["unknown_jobs"]
        del data["waiting_until"]
        del data["paused"]
        if data["error"] is None:
            del data["error"]
        if data["stopped"] is None:
            del data["stopped"]
        if not data["backends"]:
            del data["backends"]
        return data

    def unknown_line(self) -> str | None:
        """The one line saying which jobs' messages were left on the queue, if any."""
        if not self.unknown_job:
            return None
        names = ", ".join(repr(name) for name in sorted(self.unknown_jobs))
        return (
            f"{self.unknown_job} messages for job {names}, which this process does not know, "
            "were left on the queue: give the module that defines it with --jobs "
            "(BATCHRUN_JOBS)"
        )

    def add_run(self, summary: Summary) -> None:
        """Count what a continuation or shard run reached."""
        # The entities it ended, not those it took on and left (stopped, claims lost).
        self.processed += summary.succeeded + summary.skipped + summary.failed
        self.succeeded += summary.succeeded
        self.skipped += summary.skipped
        self.failed += summary.failed
        self.dead_lettered += summary.dead_lettered
        self.lost_claims += summary.lost_claims
        self.unknown_outcome += summary.unknown_outcome

    def add_entity(self, state: State | None) -> None:
        """Count one entity a retry or task message named, by how it ended (one that did
        not end, e.g. left pending, is not processed)."""
        if state in (State.SUCCEEDED, State.SKIPPED, State.RETRYING, State.FAILED):
            self.processed += 1
        if state is State.SUCCEEDED:
            self.succeeded += 1
        elif state is State.SKIPPED:
            self.skipped += 1
        elif state is State.RETRYING:
            self.failed += 1
        elif state is State.FAILED:
            self.failed += 1
            self.dead_lettered += 1


@dataclass
class FanOut(_Report):
    """What ``--fan-out`` queued."""

    job: str
    period: str
    shards: int = 0
    users: int = 0  # entities, under the name batchrun 0.1 used
    duration_s: float = 0.0
    month: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        if data["month"] is None:
            del data["month"]
        return data

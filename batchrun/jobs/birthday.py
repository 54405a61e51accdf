"""The birthday job: keyset pages of users -> claims -> gift cards -> one email each.

Exactly-once rests on the database, not on this code: the ledger's primary key and its
lease serialize work on a user, and ``gift_card.idempotency_key`` is UNIQUE, so overlapping
runs, crashes and retries can never create a second card. Outcomes are recorded by a group
commit that a worker awaits before taking its next user, so at most ``concurrency`` accepted
messages are ever unrecorded: that bounds the one duplicate-email window a crash can open.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from email.utils import parseaddr
from typing import Any, Literal

from batchrun import codes
from batchrun.db.store import FINAL_STATES, MAX_ID, Candidate, Claim, State, Store, now_ms
from batchrun.engine import Progress, Runner, StopToken
from batchrun.errors import (
    DatabaseError,
    MailConnectionError,
    PermanentMailError,
    QueueError,
    TemporaryMailError,
    ThrottledError,
)
from batchrun.jobs.month import Month, parse_month
from batchrun.mail.base import Mailer, Message, valid_address
from batchrun.queue.base import (
    PoisonMessage,
    QueueMessage,
    Received,
    RetryQueue,
    backoff_s,
)
from batchrun.ratelimit import AdaptiveRate
from batchrun.settings import Settings

log = logging.getLogger(__name__)

JOB = "birthday"
CARD_STATUS = 1
MAX_THROTTLED = 20  # sends of one message under throttling before it goes to the retry queue
SEND_BATCH = 10  # SQS's SendMessageBatch limit
IDLE_POLL_S = 0.5  # a worker's pause between empty receives (SQS long-polls on top)
DEFAULT_AUTO_RATE = 10.0  # where --rate auto starts when the provider does not say its limit


class _Report:
    """The JSON form every result shares: its fields, the duration rounded to a millisecond."""

    duration_s: float

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        data["duration_s"] = round(self.duration_s, 3)
        return dict(data)


@dataclass
class Summary(_Report):
    """The result of one `birthday` run; ``to_json`` is the contract's JSON summary."""

    job: str
    month: str
    dry_run: bool
    eligible: int = 0
    skipped: int = 0
    cards_created: int = 0
    emails_sent: int = 0
    failed: int = 0
    queued_for_retry: int = 0
    dead_lettered: int = 0
    not_queued: int = 0  # temporary failures the retry queue did not take (kept in the ledger)
    left_pending: int = 0  # claimed but not worked on when the run stopped (released)
    continuation: bool = False  # the rest of the month was handed on through the queue
    stopped: str | None = None
    throttles: int = 0  # sends the provider throttled (slowed down and sent again)
    send_rate: float | None = None  # the pace the adaptive rate settled at (sends/s)
    send_rate_peak: float | None = None
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        """0 all done; 3 some users wait for a retry (or could not be queued)."""
        return 3 if self.queued_for_retry or self.not_queued else 0


@dataclass
class RetrySummary(_Report):
    """The result of one `retry` drain."""

    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    remaining: int = 0
    requeued: int = 0  # ledger failures whose retry message was re-sent
    duration_s: float = 0.0

    @property
    def exit_code(self) -> int:
        return 3 if self.failed else 0

    def count(self, verdict: Verdict) -> None:
        """Add one processed message's verdict to the totals."""
        self.processed += 1
        if verdict.summary is not None:  # a continuation: count the users it reached
            self.succeeded += verdict.summary.emails_sent
            self.failed += verdict.summary.failed
        elif verdict.outcome is State.SENT:
            self.succeeded += 1
        elif verdict.action == "later" and verdict.outcome is not None:
            self.failed += 1
        elif verdict.action == "dead":
            self.failed += 1
            self.dead_lettered += 1
        elif verdict.action == "poison":
            self.dead_lettered += 1


@dataclass
class FanOut(_Report):
    """What `birthday --fan-out` queued."""

    job: str
    month: str
    shards: int = 0
    users: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one received queue message after working on it."""

    action: Literal["delete", "later", "dead", "poison"]
    reason: str = ""
    delay_s: float = 0.0
    outcome: State | None = None  # the user's outcome, when the message named a user
    summary: Summary | None = None  # the run a continuation message started


@dataclass(frozen=True, slots=True)
class Task:
    """One claimed user with a card, ready to be emailed."""

    user_id: int
    year: int
    first_name: str
    last_name: str
    email: str
    code: str


@dataclass(slots=True)
class Prepared:
    """What ``prepare`` did to a page: tasks to send, claims seen, users skipped."""

    tasks: list[Task]
    claims: dict[int, Claim]
    skipped: list[int]


@dataclass(slots=True)
class Outcome:
    state: State
    reason: str | None = None


@dataclass
class Options:
    """Run options from the CLI or the Lambda event."""

    concurrency: int = 20
    rate: float | Literal["auto"] | None = None  # "auto": up to the provider's own limit
    page_size: int = 500
    limit: int | None = None
    handoff: bool = False  # on a stop, hand the rest of the month on through the queue
    grace_s: float = 30.0  # after a stop, how long in-flight sends may take to finish
    on_progress: Callable[[Progress], None] | None = None


class CircuitBreaker:
    """Opens after ``threshold`` consecutive connection-level mail failures."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.consecutive = 0
        self.open = False

    def success(self) -> None:
        self.consecutive = 0

    def failure(self) -> bool:
        """Record a failure; True when this one opened the breaker."""
        self.consecutive += 1
        if not self.open and self.consecutive >= self.threshold:
            self.open = True
            return True
        return False


class Recorder:
    """Group commit of outcomes: a worker's ``record`` returns once its row is written."""

    def __init__(
        self,
        store: Store,
        queue: RetryQueue | None,
        *,
        month: Month,
        me: str,
        summary: Summary | None,
        enqueue: bool,
    ) -> None:
        self.store = store
        self.queue = queue
        self.month = month
        self.me = me
        self.summary = summary
        self.enqueue = enqueue  # False in `retry`: the message already on the queue is reused
        self._pending: list[tuple[Task, Outcome, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def record(self, task: Task, outcome: Outcome) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((task, outcome, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:1000], self._pending[1000:]
            try:
                await self.write([(t, o) for t, o, _ in batch])
            except BaseException as exc:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for _, _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def write(self, batch: Sequence[tuple[Task, Outcome]]) -> None:
        """Write outcomes: one UPDATE for all sent, one per distinct failure reason."""
        year = self.month.year
        sent = [t.user_id for t, o in batch if o.state is State.SENT]
        await self.store.finish(year=year, ids=sent, me=self.me, state=State.SENT)
        failures: dict[tuple[State, str | None], list[Task]] = {}
        for task, outcome in batch:
            if outcome.state is not State.SENT:
                failures.setdefault((outcome.state, outcome.reason), []).append(task)
        for (state, reason), tasks in failures.items():
            ids = [t.user_id for t in tasks]
            queued = False
            if self.enqueue and self.queue is not None:
                queued = await self._enqueue(state, reason or "", tasks)
            await self.store.finish(
                year=year,
                ids=ids,
                me=self.me,
                state=state,
                error=reason,
                queued=queued or not self.enqueue,
            )

    async def _enqueue(self, state: State, reason: str, tasks: Sequence[Task]) -> bool:
        assert self.queue is not None
        bodies = [
            QueueMessage(
                "retry", JOB, str(self.month), user_id=t.user_id, attempt=1, reason=reason
            ).to_json()
            for t in tasks
        ]
        try:
            if state is State.FAILED:
                await self.queue.send_dead([(b, reason) for b in bodies])
            else:
                await self.queue.send(bodies)
        except QueueError as exc:
            log.error(
                "retry queue unreachable; %d failures stay in the ledger: %s", len(tasks), exc
            )
            if self.summary is not None and state is State.RETRYING:
                self.summary.not_queued += len(tasks)
            return False
        if self.summary is not None:
            if state is State.FAILED:
                self.summary.dead_lettered += len(tasks)
            else:
                self.summary.queued_for_retry += len(tasks)
        return True

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


class BirthdayJob:
    """Runs the birthday job and drains its retry queue with the same per-user pipeline."""

    def __init__(
        self,
        store: Store,
        mailer: Mailer | None,
        queue: RetryQueue | None,
        settings: Settings,
        *,
        stop: StopToken | None = None,
    ) -> None:
        self.store = store
        self.mailer = mailer
        self.queue = queue
        self.settings = settings
        self.stop = stop or StopToken()
        self.throttles = 0  # sends the provider throttled, over this job's life
        self._retry_limiter: AdaptiveRate | None = None  # one pacer for a whole retry drain
        self.lease_ms = int(settings.lease_s * 1000)
        self.poll_s = min(1.0, settings.lease_s / 5)
        domain = parseaddr(settings.sender)[1].rpartition("@")[2] or "localhost"
        self.domain = domain

    # -- the month ------------------------------------------------------------------------

    async def run(
        self,
        month: Month,
        options: Options | None = None,
        *,
        dry_run: bool = False,
        after: int = 0,
        until: int = MAX_ID,
    ) -> Summary:
        """Run the month (users with ids in (after, until]): each ends sent, skipped, failed
        or queued."""
        options = options or Options()
        summary = Summary(JOB, str(month), dry_run)
        started = time.monotonic()
        if dry_run:
            await self._dry_run(month, options, summary, after)
            summary.duration_s = time.monotonic() - started
            return summary
        assert self.mailer is not None and self.queue is not None
        me = uuid.uuid4().hex
        recorder = Recorder(
            self.store, self.queue, month=month, me=me, summary=summary, enqueue=True
        )
        breaker = CircuitBreaker(self.settings.breaker_threshold)
        limiter = await self.make_limiter(options)
        throttles_before = self.throttles
        runner: Runner[Task] = Runner(
            concurrency=options.concurrency,
            stop=self.stop,
            grace_s=options.grace_s,
            on_progress=options.on_progress,
            limiter=limiter,
        )
        pager = _Pager(self, month, me, options, summary, runner, start_after=after, until=until)
        heartbeat = asyncio.create_task(self._heartbeat(me))
        try:
            result = await runner.run(
                pager.tasks(), self._worker(runner, recorder, summary, breaker)
            )
            leftover = [*result.not_started, *result.cancelled, *pager.unyielded]
            await recorder.close()
            if breaker.open:
                summary.stopped = "mail backend unreachable (circuit breaker open)"
                await recorder.write(
                    [(t, Outcome(State.RETRYING, summary.stopped)) for t in leftover]
                )
                summary.failed += len(leftover)
            elif leftover:
                await self.store.release(year=month.year, ids=[t.user_id for t in leftover], me=me)
                summary.left_pending += len(leftover)
            if self.stop.stopping and summary.stopped is None:
                summary.stopped = self.stop.reason or "stopped"
            handing_off = breaker.open or (self.stop.stopping and options.handoff)
            if handing_off and (leftover or not pager.done):
                # Resume below every user this run did not finish (released or held by
                # another run), so the continuation misses no one; finished users in
                # between are filtered out by the page query itself.
                unfinished = [t.user_id for t in leftover] + sorted(pager.foreign)
                resume = min([pager.cursor, *(uid - 1 for uid in unfinished)])
                await self._continue(month, resume, until, summary)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await recorder.close()
        summary.throttles = self.throttles - throttles_before
        if limiter is not None:
            summary.send_rate = round(limiter.settled, 2)
            summary.send_rate_peak = round(limiter.peak, 2)
        summary.duration_s = time.monotonic() - started
        return summary

    async def make_limiter(self, options: Options) -> AdaptiveRate | None:
        """The send pacer for ``options.rate``: AIMD from that rate, or from the provider's."""
        if options.rate is None:
            return None
        if options.rate == "auto":
            probe = getattr(self.mailer, "max_send_rate", None)
            ceiling = await probe() if probe is not None else None
            if ceiling is None:
                log.warning(
                    "the mail backend states no send rate: starting --rate auto at %g/s",
                    DEFAULT_AUTO_RATE,
                )
            return AdaptiveRate(ceiling or DEFAULT_AUTO_RATE, ceiling=ceiling)
        return AdaptiveRate(options.rate, ceiling=options.rate)

    async def _dry_run(self, month: Month, options: Options, summary: Summary, after: int) -> None:
        """Count what a run would do; reads only."""
        while True:
            page = await self.store.eligible_page(
                year=month.year,
                month=month.month,
                after=after,
                limit=_page_limit(options, summary.eligible),
            )
            if not page:
                return
            after = page[-1].user_id
            for candidate in page:
                summary.eligible += 1
                if not valid_address(candidate.email):
                    summary.skipped += 1
            if options.on_progress:
                options.on_progress(Progress("done", len(page)))
            if options.limit is not None and summary.eligible >= options.limit:
                return

    async def _continue(self, month: Month, cursor: int, until: int, summary: Summary) -> None:
        assert self.queue is not None
        body = QueueMessage(
            "continuation", JOB, str(month), after_id=cursor, until_id=until
        ).to_json()
        try:
            await self.queue.send([body])
        except QueueError as exc:
            log.error(
                "could not hand the rest of %s on (%s); rerun `batchrun birthday`", month, exc
            )
            return
        summary.continuation = True

    async def _heartbeat(self, me: str) -> None:
        """Keep this run's claims alive; a dead run's claims expire after one lease."""
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            try:
                await self.store.heartbeat(me=me, lease_ms=self.lease_ms)
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    def _worker(
        self,
        runner: Runner[Task],
        recorder: Recorder,
        summary: Summary,
        breaker: CircuitBreaker,
    ) -> Callable[[Task], Any]:
        mailer = self.mailer
        assert mailer is not None

        async def work(task: Task) -> None:
            outcome = await self._send(task, runner, breaker, mailer)
            if outcome.state is State.SENT:
                summary.emails_sent += 1
                runner.progress("done")
            else:
                summary.failed += 1
                runner.progress("failed")
            await recorder.record(task, outcome)

        return work

    async def _send(
        self, task: Task, runner: Runner[Task], breaker: CircuitBreaker, mailer: Mailer
    ) -> Outcome:
        if breaker.open:
            return Outcome(State.RETRYING, "mail backend unreachable (circuit breaker open)")
        message = self.message(task)
        try:
            await self._send_paced(message, runner, mailer)
        except ThrottledError as exc:
            breaker.success()
            return Outcome(State.RETRYING, f"still throttled after {MAX_THROTTLED} tries: {exc}")
        except PermanentMailError as exc:
            breaker.success()
            return Outcome(State.FAILED, exc.reason)
        except MailConnectionError as exc:
            if breaker.failure():
                log.error(
                    "mail backend unreachable after %d failures in a row; stopping",
                    breaker.consecutive,
                )
                self.stop.request("mail backend unreachable")
            return Outcome(State.RETRYING, exc.reason)
        except TemporaryMailError as exc:
            breaker.success()
            return Outcome(State.RETRYING, exc.reason)
        breaker.success()
        return Outcome(State.SENT)

    async def _send_paced(self, message: Message, runner: Runner[Task], mailer: Mailer) -> None:
        """Send through the limiter; on throttling slow down and send the same message again.

        Throttling is the provider asking for a lower rate, not the user failing: the
        adaptive limiter halves its rate when a ThrottledError leaves its block, and the
        message goes again at the new pace.
        """
        for attempt in range(1, MAX_THROTTLED + 1):
            try:
                async with runner.limiter:
                    await mailer.send(message)
                return
            except ThrottledError as exc:
                self.throttles += 1
                if attempt == MAX_THROTTLED or self.stop.aborting:
                    raise
                if not isinstance(runner.limiter, AdaptiveRate):
                    # No pacer to slow down: back off this send alone, with jitter.
                    pause = exc.retry_after_s or min(5.0, 0.1 * 2**attempt)
                    await asyncio.sleep(pause * random.uniform(0.5, 1.0))

    def message(self, task: Task) -> Message:
        """The birthday email of ``task``, with a Message-ID stable per (job, year, user)."""
        name = " ".join(p for p in (task.first_name, task.last_name) if p).strip()
        greeting = task.first_name or "there"
        code = codes.display(task.code)
        text = (
            f"Happy birthday, {greeting}!\n\n"
            f"Here is a gift card for you: {code}\n\n"
            "Enjoy your day.\n"
        )
        body_html = (
            f"<p>Happy birthday, {html.escape(greeting)}!</p>"
            f"<p>Here is a gift card for you: <strong>{code}</strong></p>"
            "<p>Enjoy your day.</p>"
        )
        return Message(
            sender=self.settings.sender,
            to_addr=task.email,
            to_name=name,
            subject="Happy birthday! A gift card for you",
            text=text,
            html=body_html,
            message_id=f"<{JOB}.{task.year}.{task.user_id}@{self.domain}>",
        )

    # -- per page: claim, skip, cards -----------------------------------------------------

    async def prepare(
        self, month: Month, me: str, candidates: Sequence[Candidate], summary: Summary | None
    ) -> Prepared:
        """Claim ``candidates``, skip invalid addresses, ensure cards; return the tasks."""
        if not candidates:
            return Prepared([], {}, [])
        claims = await self.store.claim(
            year=month.year,
            month=month.month,
            ids=[c.user_id for c in candidates],
            new_ids=[c.user_id for c in candidates if c.state is None],
            me=me,
            lease_ms=self.lease_ms,
        )
        mine = [
            c
            for c in candidates
            if (claim := claims.get(c.user_id)) is not None
            and claim.owner == me
            and claim.state not in FINAL_STATES
        ]
        checked = [(c, valid_address(c.email)) for c in mine]
        invalid = [c.user_id for c, ok in checked if not ok]
        if invalid:
            await self.store.finish(
                year=month.year,
                ids=invalid,
                me=me,
                state=State.SKIPPED,
                error="invalid email address",
            )
        valid = [c for c, ok in checked if ok]
        cards, created = await self.ensure_cards(month, valid)
        if summary is not None:
            summary.eligible += len(mine)
            summary.skipped += len(invalid)
            summary.cards_created += created
        tasks = [
            Task(
                c.user_id,
                month.year,
                c.first_name or "",
                c.last_name or "",
                c.email,
                cards[c.user_id],
            )
            for c in valid
        ]
        return Prepared(tasks, claims, invalid)

    async def ensure_cards(
        self, month: Month, users: Sequence[Candidate]
    ) -> tuple[dict[int, str], int]:
        """Every user's card code (existing or new) and how many this call created."""
        if not users:
            return {}, 0
        key_of = {c.user_id: f"{JOB}:{month.year}:{c.user_id}" for c in users}
        scheduled = f"{month.year:04d}-{month.month:02d}-01 00:00:00"
        codes_by_user: dict[int, str] = {}
        created = 0
        todo = list(users)
        for _ in range(5):  # a gift-code collision (80 bits) is retried with a fresh code
            fresh = dict(zip((c.user_id for c in todo), codes.new_codes(len(todo)), strict=True))
            inserted = await self.store.insert_cards(
                [
                    (
                        c.email,
                        self.settings.card_message,
                        CARD_STATUS,
                        scheduled,
                        fresh[c.user_id],
                        key_of[c.user_id],
                    )
                    for c in todo
                ]
            )
            if inserted == len(todo):
                # Every card is new: the codes are ours, nothing to read back.
                codes_by_user.update(fresh)
                return codes_by_user, created + inserted
            existing = await self.store.cards_by_key([key_of[c.user_id] for c in todo])
            missing = []
            for c in todo:
                code = existing.get(key_of[c.user_id])
                if code is None:
                    missing.append(c)
                    continue
                codes_by_user[c.user_id] = code
                created += code == fresh[c.user_id]
            if not missing:
                return codes_by_user, created
            todo = missing
        raise DatabaseError(
            f"could not create a unique gift code for users {[c.user_id for c in todo[:5]]}"
        )

    # -- the retry queue ------------------------------------------------------------------

    async def retry(
        self, options: Options | None = None, *, max_messages: int = 10_000
    ) -> RetrySummary:
        """Drain the retry queue once: redo each user, delete successes, back off the rest."""
        options = options or Options()
        assert self.queue is not None and self.mailer is not None
        queue = self.queue
        started = time.monotonic()
        result = RetrySummary()
        result.requeued = await self.requeue_unqueued()
        visibility = max(60.0, self.settings.lease_s * 4)
        while result.processed < max_messages and not self.stop.stopping:
            items: list[Received] = []
            want = min(max(options.concurrency, 10), max_messages - result.processed)
            while len(items) < want:
                got = await queue.receive(
                    max_messages=min(10, want - len(items)), visibility_s=visibility
                )
                if not got:
                    break
                items.extend(got)
            if not items:
                break
            await self._process_and_settle(queue, items, options, result, visibility)
        depth, _ = await queue.depths()
        result.remaining = depth
        result.duration_s = time.monotonic() - started
        return result

    async def serve(
        self,
        queue: RetryQueue,
        options: Options | None = None,
        *,
        prefetch: int = 1,
        visibility_s: float = 120.0,
        idle_exit_s: float | None = None,
    ) -> RetrySummary:
        """Consume ``queue`` until stopped (or idle for ``idle_exit_s``): shards, retries and
        continuations, each message kept invisible while it is worked on."""
        options = options or Options()
        started = time.monotonic()
        result = RetrySummary()
        idle_since = time.monotonic()
        while not self.stop.stopping:
            items = await queue.receive(max_messages=prefetch, visibility_s=visibility_s)
            if not items:
                if idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s:
                    break
                await _sleep_unless(self.stop, IDLE_POLL_S)
                continue
            await self._process_and_settle(queue, items, options, result, visibility_s)
            idle_since = time.monotonic()
        result.remaining, _ = await queue.depths()
        result.duration_s = time.monotonic() - started
        return result

    async def _process_and_settle(
        self,
        queue: RetryQueue,
        items: list[Received],
        options: Options,
        result: RetrySummary,
        visibility_s: float,
    ) -> None:
        """Work on received messages, then delete, hide or dead-letter each by its verdict."""
        keepalive = asyncio.create_task(self._keep_invisible(queue, items, visibility_s))
        try:
            verdicts = await self.process(items, options)
        finally:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive
        done = []
        for item in items:
            verdict = verdicts[item.message_id]
            result.count(verdict)
            if verdict.action == "delete":
                done.append(item)
            elif verdict.action == "later":
                await queue.retry_later(item, verdict.delay_s)
            else:
                await queue.dead_letter(item, verdict.reason)
        await queue.delete(done)

    async def _keep_invisible(
        self, queue: RetryQueue, items: list[Received], visibility_s: float
    ) -> None:
        """Heartbeat: extend the messages' visibility while they are worked on, so a long
        shard is not delivered to a second consumer; a dead consumer's reappear."""
        while True:
            await asyncio.sleep(visibility_s / 3)
            for item in items:
                try:
                    await queue.retry_later(item, visibility_s)
                except Exception as exc:
                    log.warning("could not extend message %s: %s", item.message_id, exc)

    async def fan_out(self, month: Month, queue: RetryQueue, *, shard_size: int) -> FanOut:
        """Queue the month's unfinished users as id ranges (shards) for many consumers."""
        started = time.monotonic()
        result = FanOut(JOB, str(month))
        after = 0
        batch: list[str] = []
        while True:
            ids = await self.store.eligible_ids(
                year=month.year, month=month.month, after=after, limit=shard_size
            )
            if not ids:
                break
            shard = QueueMessage("shard", JOB, str(month), after_id=after, until_id=ids[-1])
            batch.append(shard.to_json())
            result.users += len(ids)
            after = ids[-1]
            if len(batch) == SEND_BATCH:
                await queue.send(batch)
                result.shards += len(batch)
                batch = []
        if batch:
            await queue.send(batch)
            result.shards += len(batch)
        result.duration_s = time.monotonic() - started
        return result

    async def requeue_unqueued(self) -> int:
        """Queue the temporary failures that a run could not queue (queue was down)."""
        assert self.queue is not None
        total = 0
        while True:
            rows = await self.store.unqueued_failures(500)
            rows = [r for r in rows if r[0] == JOB]
            if not rows:
                return total
            by_year: dict[int, list[int]] = {}
            bodies = []
            for job, year, month, user_id, attempts, error in rows:
                bodies.append(
                    QueueMessage(
                        "retry",
                        job,
                        f"{int(year):04d}-{int(month):02d}",
                        user_id=int(user_id),
                        attempt=int(attempts),
                        reason=error or "",
                    ).to_json()
                )
                by_year.setdefault(int(year), []).append(int(user_id))
            await self.queue.send(bodies)
            for year, ids in by_year.items():
                await self.store.mark_queued(year=year, ids=ids)
            total += len(rows)

    async def process(self, items: Sequence[Received], options: Options) -> dict[str, Verdict]:
        """Work on received queue messages; say what to do with each (by message id).

        The caller acts on the verdicts: `batchrun retry` deletes, hides or dead-letters;
        the Lambda handler turns them into its batchItemFailures.
        """
        verdicts: dict[str, Verdict] = {}
        by_month: dict[Month, list[tuple[Received, QueueMessage]]] = {}
        for item in items:
            try:
                message = QueueMessage.from_json(item.body)
            except PoisonMessage as exc:
                log.error("poison message %s: %s", item.message_id, exc)
                verdicts[item.message_id] = Verdict("poison", f"poison: {exc}")
                continue
            if message.kind in ("continuation", "shard"):
                log.info(
                    "%s of %s: users (%d, %d]",
                    message.kind,
                    message.month,
                    message.after_id,
                    message.until_id,
                )
                summary = await self.run(
                    parse_month(message.month),
                    options,
                    after=message.after_id,
                    until=message.until_id,
                )
                verdicts[item.message_id] = Verdict("delete", summary=summary)
                continue
            by_month.setdefault(parse_month(message.month), []).append((item, message))
        for month, entries in by_month.items():
            verdicts.update(await self._retry_users(month, entries, options))
        return verdicts

    async def _retry_users(
        self, month: Month, entries: list[tuple[Received, QueueMessage]], options: Options
    ) -> dict[str, Verdict]:
        me = uuid.uuid4().hex
        ids = sorted({m.user_id for _, m in entries})
        users = await self.store.users_by_id(ids)
        before = await self.store.claims_of(year=month.year, ids=ids)
        candidates = []
        gone: set[int] = set()
        for uid in ids:
            row = users.get(uid)
            if row is None or row[4] != 10 or row[3] is None:
                gone.add(uid)  # deleted, deactivated or address removed: nothing to send
                continue
            claim = before.get(uid)
            candidates.append(
                Candidate(
                    uid,
                    row[1],
                    row[2],
                    row[3],
                    claim.state if claim else None,
                    claim.owner if claim else None,
                    claim.lease_until if claim else None,
                )
            )
        prepared = await self.prepare(month, me, candidates, None)
        outcomes = dict.fromkeys(prepared.skipped, Outcome(State.SKIPPED, "invalid address"))
        last_receive = {m.user_id: i.receive_count for i, m in entries}
        if prepared.tasks:
            outcomes.update(await self._resend(month, me, prepared.tasks, last_receive, options))
        verdicts: dict[str, Verdict] = {}
        for item, message in entries:
            verdicts[item.message_id] = self._verdict(
                item,
                message.user_id in gone,
                outcomes.get(message.user_id),
                prepared.claims.get(message.user_id),
            )
        return verdicts

    async def _resend(
        self,
        month: Month,
        me: str,
        tasks: list[Task],
        last_receive: dict[int, int],
        options: Options,
    ) -> dict[int, Outcome]:
        """Send to claimed users again; after the last allowed attempt a failure is final."""
        assert self.mailer is not None and self.queue is not None
        mailer, max_receives = self.mailer, self.queue.max_receives
        recorder = Recorder(self.store, self.queue, month=month, me=me, summary=None, enqueue=False)
        if self._retry_limiter is None:
            self._retry_limiter = await self.make_limiter(options)
        runner: Runner[Task] = Runner(
            concurrency=options.concurrency,
            stop=self.stop,
            grace_s=options.grace_s,
            on_progress=options.on_progress,
            limiter=self._retry_limiter,
        )
        breaker = CircuitBreaker(self.settings.breaker_threshold)
        outcomes: dict[int, Outcome] = {}

        async def work(task: Task) -> None:
            outcome = await self._send(task, runner, breaker, mailer)
            attempts = last_receive.get(task.user_id, 0)
            if outcome.state is State.RETRYING and attempts >= max_receives:
                outcome = Outcome(
                    State.FAILED, f"gave up after {attempts} attempts: {outcome.reason}"
                )
            outcomes[task.user_id] = outcome
            await recorder.record(task, outcome)

        try:
            run = await runner.run(_iterate(tasks), work)
        finally:
            await recorder.close()
        leftover = [t.user_id for t in [*run.not_started, *run.cancelled]]
        await self.store.release(year=month.year, ids=leftover, me=me)
        return outcomes

    def _verdict(
        self, item: Received, gone: bool, outcome: Outcome | None, claim: Claim | None
    ) -> Verdict:
        if gone:
            return Verdict("delete")  # nothing to send to any more
        if outcome is None:
            if claim is not None and claim.state in FINAL_STATES:
                return Verdict("delete")  # finished meanwhile (by a rerun): nothing to do
            # Another live run holds the user, or we stopped first: look again later.
            return Verdict("later", delay_s=self.settings.lease_s)
        if outcome.state in (State.SENT, State.SKIPPED):
            return Verdict("delete", outcome=outcome.state)
        if outcome.state is State.FAILED:
            return Verdict("dead", outcome.reason or "failed", outcome=State.FAILED)
        delay = backoff_s(
            item.receive_count,
            base_s=self.settings.retry_base_s,
            max_s=self.settings.retry_max_backoff_s,
        )
        return Verdict("later", outcome.reason or "", delay_s=delay, outcome=State.RETRYING)


class _Pager:
    """The task source of a run: keyset pages, then the users other runs held."""

    def __init__(
        self,
        job: BirthdayJob,
        month: Month,
        me: str,
        options: Options,
        summary: Summary,
        runner: Runner[Task],
        *,
        start_after: int,
        until: int,
    ) -> None:
        self.job = job
        self.month = month
        self.me = me
        self.options = options
        self.summary = summary
        self.runner = runner
        self.cursor = start_after
        self.until = until
        self.done = False  # every page was read and every foreign claim settled
        self.foreign: set[int] = set()
        self.unyielded: deque[Task] = deque()

    async def tasks(self) -> AsyncIterator[Task]:
        store, month, stop = self.job.store, self.month, self.job.stop
        # A month nobody has started needs no ledger join on its pages (one row read per
        # user instead of two); whatever another run does meanwhile, claiming sorts out.
        fresh = not await store.month_started(year=month.year, month=month.month)
        while not stop.stopping:
            limit = _page_limit(self.options, self.summary.eligible)
            if limit <= 0:
                self.done = True
                return
            page = await store.eligible_page(
                year=month.year,
                month=month.month,
                after=self.cursor,
                limit=limit,
                until=self.until,
                fresh=fresh,
            )
            if not page:
                break
            self.cursor = page[-1].user_id
            prepared = await self.job.prepare(month, self.me, page, self.summary)
            self._note_foreign(prepared.claims)
            if prepared.skipped:
                self.runner.progress("skipped", len(prepared.skipped))
            async for task in self._drain(prepared.tasks):
                yield task
        else:
            return
        # Users other runs hold: wait until they finish them or their claims expire.
        while self.foreign and not stop.stopping:
            await _sleep_unless(stop, self.job.poll_s)
            ids = sorted(self.foreign)
            claims = await store.claims_of(year=month.year, ids=ids)
            now = now_ms()
            takeable = []
            for uid in ids:
                claim = claims.get(uid)
                if claim is None or claim.state != State.PENDING:
                    self.foreign.discard(uid)  # finished, failed or queued by its owner
                elif claim.owner is None or (claim.lease_until or 0) < now:
                    takeable.append(uid)
            if not takeable:
                continue
            users = await store.users_by_id(takeable)
            candidates = [
                Candidate(
                    uid,
                    r[1],
                    r[2],
                    r[3],
                    claims[uid].state,
                    claims[uid].owner,
                    claims[uid].lease_until,
                )
                for uid, r in users.items()
                if r[4] == 10 and r[3] is not None
            ]
            self.foreign -= set(takeable)
            prepared = await self.job.prepare(month, self.me, candidates, self.summary)
            self._note_foreign(prepared.claims)
            async for task in self._drain(prepared.tasks):
                yield task
        self.done = not stop.stopping

    async def _drain(self, tasks: list[Task]) -> AsyncIterator[Task]:
        # Claimed tasks wait here until the runner takes them: if the run stops first,
        # ``unyielded`` still names them, so they are released or queued, never forgotten.
        self.unyielded.extend(tasks)
        while self.unyielded and not self.job.stop.stopping:
            yield self.unyielded.popleft()

    def _note_foreign(self, claims: dict[int, Claim]) -> None:
        # Every user another owner holds, live or not: a lease that expired after this
        # page's claim was tried is taken over by the wait loop, never dropped.
        for uid, claim in claims.items():
            if claim.owner not in (None, self.me) and claim.state == State.PENDING:
                self.foreign.add(uid)


def _page_limit(options: Options, seen: int) -> int:
    if options.limit is None:
        return options.page_size
    return min(options.page_size, options.limit - seen)


async def _iterate(items: Sequence[Task]) -> AsyncIterator[Task]:
    for item in items:
        yield item


async def _sleep_unless(stop: StopToken, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait_stopping(), timeout=seconds)


__all__ = ["BirthdayJob", "Options", "RetrySummary", "Summary"]

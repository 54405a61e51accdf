"""``ctx.send_email`` for a run: render, build the message, fence, pace, send; and
``ctx.paced()``, the same pacer around any other effect (policy/pacing.py).

Throttling is the provider asking for a lower rate, not the entity failing: the adaptive
limiter halves its rate when a ThrottledError leaves its block, and the same message goes
again at the new pace (up to ``MAX_THROTTLED`` times).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager, nullcontext
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any, Literal

from batchrun import unsubscribe
from batchrun.errors import ThrottledError, UsageError
from batchrun.job import Context, Retry, Skip
from batchrun.mail.base import Mailer, Message, valid_address
from batchrun.policy.pacing import BREAKER_REASON as BREAKER_REASON  # re-exported
from batchrun.policy.pacing import CircuitBreaker as CircuitBreaker  # re-exported
from batchrun.policy.pacing import Pacer
from batchrun.policy.rate import AdaptiveRate
from batchrun.settings import Settings

if TYPE_CHECKING:
    from batchrun.db.store import Store
    from batchrun.effects.backends import BackendPool
    from batchrun.pipeline.engine import StopToken
    from batchrun.pipeline.lease import Lease
    from batchrun.pipeline.reports import Summary
    from batchrun.templates import Templates

log = logging.getLogger(__name__)

MAX_THROTTLED = 20  # sends of one message under throttling before it goes to the retry queue
DEFAULT_AUTO_RATE = 10.0  # where --rate auto starts when the provider does not say its limit
KEEP_LOOKED_UP = 10_000  # suppression answers kept per generation: a few pages' worth


async def make_limiter(
    mailer: Mailer | None, rate: float | Literal["auto"] | None
) -> AdaptiveRate | None:
    """The send pacer for ``rate``: AIMD from that rate, or from the provider's own."""
    if rate is None:
        return None
    if rate == "auto":
        probe = getattr(mailer, "max_send_rate", None)
        ceiling = await probe() if probe is not None else None
        if ceiling is None:
            log.warning(
                "the mail backend states no send rate: starting --rate auto at %g/s",
                DEFAULT_AUTO_RATE,
            )
        start = ceiling or DEFAULT_AUTO_RATE
        return AdaptiveRate(start, ceiling=ceiling, floor=min(0.5, start))
    # A rate below the default floor (0.5/s) is a floor of its own: --rate 0.2 is honoured.
    return AdaptiveRate(rate, ceiling=rate, floor=min(0.5, rate))


class Suppressions:
    """The suppression list as one run sees it: looked up a page at a time (the pager asks
    for each page's addresses before ``prepare``), the answers kept for ``send_email``.

    Two generations of at most ``keep`` answers each: a page still being worked on when
    the next one is looked up keeps its answers, and memory stays bounded in a long run.
    """

    def __init__(self, store: Store | None, keep: int = KEEP_LOOKED_UP) -> None:
        self.store = store  # None: no list (a unit test's context)
        self.keep = keep
        self.queries = 0
        self._recent: dict[str, str | None] = {}  # address as given -> reason, None if not
        self._older: dict[str, str | None] = {}

    async def reasons(self, addresses: Iterable[str]) -> dict[str, str]:
        """The suppressed ones among ``addresses``, with their reasons."""
        found: dict[str, str] = {}
        unknown: list[str] = []
        for address in addresses:
            reason = self._recent.get(address, self._older.get(address, ""))
            if reason == "":  # not looked up yet (no reason is empty)
                unknown.append(address)
            elif reason is not None:
                found[address] = reason
        if unknown and self.store is not None:
            answers = await self.store.suppressed(unknown)
            self.queries += 1
            if len(self._recent) + len(unknown) > self.keep:
                self._older, self._recent = self._recent, {}
            for address in unknown:
                reason = answers.get(address)
                self._recent[address] = reason
                if reason is not None:
                    found[address] = reason
        return found


class Sender:
    """The effects a run lends its contexts: email through one mailer, the suppression
    list, and the counters."""

    def __init__(
        self,
        mailer: Mailer | None,
        settings: Settings,
        *,
        summary: Summary | None,
        lease: Lease | None,
        stop: StopToken,
        limiter: AdaptiveRate | None,
        templates: Templates | None,
        store: Store | None = None,
        sender: str | None = None,
        breaker: CircuitBreaker | None = None,
        backends: BackendPool | None = None,
    ) -> None:
        self.mailer = mailer
        self.backends = backends  # the jobs' named backends (None: no calls from here)
        self.settings = settings
        self.summary = summary
        self.lease = lease
        self.stop = stop
        self.limiter: AbstractAsyncContextManager[None] = limiter or nullcontext()
        self.adaptive = limiter
        # Every effect of the run goes through one pacer: mail below, the rest ctx.paced().
        self.pacer = Pacer(limiter, breaker or CircuitBreaker(settings.breaker_threshold))
        self.templates = templates
        self.throttles = 0
        self.emails_sent = 0
        # The job's From (Settings.sender_for); a bare Sender (the bench's) takes --from.
        from_addr = sender or settings.sender
        if from_addr is None:
            raise ValueError("a Sender needs a From: sender= or Settings.sender")
        self.from_addr = from_addr
        name, address = parseaddr(from_addr)
        self.domain = address.rpartition("@")[2] or "localhost"
        # Templates' ``brand``: BATCHRUN_BRAND, else the From's display name.
        self.defaults: dict[str, Any] = {"brand": settings.brand or name or None}
        self.signer = unsubscribe.Signer.from_settings(settings)
        self.suppressions = Suppressions(store)

    def paced(self) -> AbstractAsyncContextManager[None]:
        """``ctx.paced()``: one call to an outside service through the run's pacer."""
        return self.pacer.call()

    def backend(self, ctx: Context, name: str) -> AbstractAsyncContextManager[None]:
        """``ctx.backend(name)``: one call through the backend's gate."""
        return self._backends(ctx, name).call(ctx, name)

    def http(self, ctx: Context, name: str) -> Any:
        """``ctx.http(name)``: the backend's httpx client."""
        return self._backends(ctx, name).http(ctx, name)

    def _backends(self, ctx: Context, name: str) -> BackendPool:
        if self.backends is None:
            # A dry run, a preview: nothing is called, as nothing is sent.
            raise UsageError(
                f"{ctx.job.name} calls backend {name!r}, which a dry run or a preview does "
                "not: a preview shows only the email a job would send"
            )
        return self.backends

    def count(self, name: str, n: int) -> None:
        if self.summary is not None:
            self.summary.count(name, n)

    async def suppressed(self, addresses: Iterable[str]) -> dict[str, str]:
        return await self.suppressions.reasons(addresses)

    async def check(self, to: str) -> None:
        """Skip an address no email may go to: an invalid one, or one on the suppression list."""
        if not valid_address(to):
            raise Skip("invalid email address")
        reason = (await self.suppressions.reasons((to,))).get(to)
        if reason is not None:
            raise Skip(f"suppressed: {reason}")

    def message(
        self,
        ctx: Context,
        *,
        to: str,
        subject: str | None,
        text: str | None,
        html: str | None,
        to_name: str | None,
        template: str | None,
        variables: dict[str, Any],
    ) -> Message:
        """The email ``send_email`` would send (``batchrun preview`` shows it)."""
        headers: tuple[tuple[str, str], ...] = ()
        url = None
        if self.signer is not None:
            url = self.signer.url(ctx.job.name, to)
            headers = unsubscribe.headers(url)
        if template is not None:
            if self.templates is None:
                raise LookupError(f"job {ctx.job.name!r} has no templates")
            # The templates' own variables, under the job's; one copy. send_year: the
            # footer's copyright year is the year the email goes out.
            defaults, year = self.defaults, time.gmtime().tm_year
            if url is None:
                namespace = {**defaults, "send_year": year, **variables}
            else:
                namespace = {**defaults, "send_year": year, "unsubscribe_url": url, **variables}
            rendered = self.templates.render(template, namespace)
            subject = subject if subject is not None else rendered.subject
            text = text if text is not None else rendered.text
            html = html if html is not None else rendered.html
        if subject is None or text is None:
            # A typo (subjetc=) lands in the template's variables: name it.
            got = f"; it got {', '.join(map(repr, variables))}" if variables else ""
            raise TypeError(f"send_email needs subject and text, or a template{got}")
        return Message(
            sender=self.from_addr,
            to_addr=to,
            to_name=to_name or "",
            subject=subject,
            text=text,
            html=html or "",
            # Stable per (job, once_per period, entity): a duplicate carries the same one.
            message_id=f"<{ctx.key.replace(':', '.')}@{self.domain}>",
            headers=headers,
        )

    async def send_email(self, ctx: Context, **fields: Any) -> None:
        await self.check(fields["to"])
        message = self.message(ctx, **fields)
        if self.mailer is None:
            raise RuntimeError("no mailer: a dry run sends nothing")
        if self.lease is not None and not self.lease.valid() and not await self.lease.fence():
            raise Retry("stopped while this run's claims were not renewed")
        await self._send_paced(self.mailer, message)
        self.emails_sent += 1
        if self.summary is not None:
            self.summary.emails_sent += 1

    async def _send_paced(self, mailer: Mailer, message: Message) -> None:
        for attempt in range(1, MAX_THROTTLED + 1):
            try:
                async with self.limiter:
                    await mailer.send(message)
                return
            except ThrottledError as exc:
                self.throttles += 1
                if attempt == MAX_THROTTLED or self.stop.aborting:
                    raise ThrottledError(
                        f"still throttled after {attempt} tries: {exc.reason}",
                        retry_after_s=exc.retry_after_s,
                    ) from exc
                if self.adaptive is None:
                    # No pacer to slow down: back off this send alone, with jitter.
                    pause = exc.retry_after_s or min(5.0, 0.1 * 2**attempt)
                    await asyncio.sleep(pause * random.uniform(0.5, 1.0))

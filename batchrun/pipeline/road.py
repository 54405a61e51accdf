"""The road itself: items from a source, each worked by an ``EntityWorker`` in a bounded pool,
its outcome applied; what was claimed and not worked comes back to the caller.

    source (pager | messages | tasks) -> Runner(concurrency) -> EntityWorker -> Applier

Every path drives it: a period run (the pager), a drain, a worker process and the
Lambda's SQS consumer (retry messages; submitted tasks), so an entity is claimed, fenced,
worked, settled and recorded the same way wherever it came from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from batchrun.pipeline.engine import Progress, Runner, StopToken
from batchrun.pipeline.gctune import fewer_collections
from batchrun.pipeline.item import Item
from batchrun.pipeline.work import EntityWorker


async def travel(
    source: AsyncIterator[Item],
    worker: EntityWorker,
    *,
    concurrency: int,
    stop: StopToken,
    grace_s: float,
    on_progress: Callable[[Progress], None] | None = None,
    unyielded: Iterable[Item] = (),
) -> list[Item]:
    """Work every item ``source`` yields; return the items claimed and not worked (a stop,
    the breaker, a bug, the source's own ``unyielded``), leaving out those whose claim
    another process took over."""
    runner: Runner[Item] = Runner(
        concurrency=concurrency, stop=stop, grace_s=grace_s, on_progress=on_progress
    )
    with fewer_collections():
        result = await runner.run(source, worker.work)
    leftover = [*result.not_started, *result.cancelled, *unyielded, *worker.unstarted]
    return [i for i in leftover if not worker.lease.lost(i)]


async def each(items: Sequence[Item]) -> AsyncIterator[Item]:
    """A source of items already claimed."""
    for item in items:
        yield item

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
    left_on_error: list[Item] | None = None,
) -> list[Item]:
    """Work every item ``source`` yields; return the items claimed and not worked (a stop,
    the breaker, a bug, the source's own ``unyielded``), leaving out those whose claim
    another process took over.

    When the work raises (the source's page failed, say), ``left_on_error`` gets the items
    that were claimed and never started, which the caller can let go of at once; the
    ones in flight keep their claims (an effect may have happened)."""
    runner: Runner[Item] = Runner(
        concurrency=concurrency, stop=stop, grace_s=grace_s, on_progress=on_progress
    )
    try:
        with fewer_collections():
            result = await runner.run(source, worker.work)
    except BaseException:
        if left_on_error is not None:
            never = [*runner.not_started_on_error, *unyielded, *worker.unstarted]
            left_on_error += [i for i in never if not worker.lease.lost(i)]
        raise
    leftover = [*result.not_started, *result.cancelled, *unyielded, *worker.unstarted]
    return [i for i in leftover if not worker.lease.lost(i)]


async def each(items: Sequence[Item]) -> AsyncIterator[Item]:
    """A source of items already claimed."""
    for item in items:
        yield item

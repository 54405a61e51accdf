"""A sequence in consecutive slices of at most so many items: for a statement or a queue
call that takes a bounded number (SQS's ten a batch, the keys of one ``IN`` list)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

T = TypeVar("T")


@overload
def chunks(items: list[T], size: int) -> Iterator[list[T]]: ...
@overload
def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]: ...
def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items[0:size]``, ``items[size:2 * size]``, ... (none for an empty sequence)."""
    if size < 1:
        raise ValueError("a chunk holds at least one item")
    for start in range(0, len(items), size):
        yield items[start : start + size]

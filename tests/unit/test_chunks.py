"""``chunks``: every item once, in order, in slices of at most the size given."""

from __future__ import annotations

import pytest

from batchrun.chunks import chunks


@pytest.mark.parametrize(("count", "size"), [(0, 3), (1, 3), (3, 3), (7, 3), (10, 10), (25, 10)])
def test_every_item_once_in_order_in_slices_of_the_size(count: int, size: int) -> None:
    items = list(range(count))
    got = list(chunks(items, size))
    assert [x for part in got for x in part] == items
    assert all(len(part) == size for part in got[:-1])
    assert all(0 < len(part) <= size for part in got)
    assert len(got) == -(-count // size)


def test_a_tuple_gives_tuples_and_a_size_below_one_is_refused() -> None:
    assert list(chunks((1, 2, 3), 2)) == [(1, 2), (3,)]
    with pytest.raises(ValueError, match="at least one"):
        list(chunks([1], 0))

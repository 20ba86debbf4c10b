"""A server's heap after its start: what survived is frozen, garbage made later is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from meshplane.cli.heap import YOUNG_THRESHOLD, settle_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_what_survived_the_start_is_frozen_and_young_collections_are_rarer(restored_gc: None) -> None:
    survivor = Node()
    settle_heap()
    assert gc.get_freeze_count() > 0
    assert not any(o is survivor for o in gc.get_objects())  # frozen: never walked again
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD


def test_cycles_made_after_the_start_are_still_collected(restored_gc: None) -> None:
    settle_heap()
    first, second = Node(), Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    gc.collect()
    assert gone() is None

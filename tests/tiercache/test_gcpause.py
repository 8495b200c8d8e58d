"""The collector pause of bulk builds: off inside, restored after (also on error); after a large build only,
every tracked object frozen (no collection), until thawed; once a process started, garbage collected first
and the rest frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tiercache.gcpause import SETTLE_MIN_OBJECTS, collector_paused, settle, settle_started, thaw


@pytest.fixture
def collector_state() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector_state")
def test_paused_inside_and_restored_after_even_on_error() -> None:
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()  # it was off before: it stays off


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def in_a_generation(obj: object) -> bool:
    """Whether the collector walks ``obj`` in one of its three generations (not frozen)."""
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation=generation))


@pytest.mark.usefixtures("collector_state", "thawed")
def test_settle_freezes_without_a_collection_only_after_a_large_build() -> None:
    gc.disable()  # no automatic pass can count as one of settle's
    passes = [s["collections"] for s in gc.get_stats()]
    assert not settle(SETTLE_MIN_OBJECTS - 1)
    assert gc.get_freeze_count() == 0
    young = [object()]  # tracked by the collector: in its youngest generation now
    assert in_a_generation(young)
    assert settle(SETTLE_MIN_OBJECTS)
    # Moved, young ones included. (Not gc.get_count(): another thread left by an earlier test may
    # allocate between the freeze and the count.)
    assert gc.get_freeze_count() > 0 and not in_a_generation(young)
    assert gc.is_tracked(young)
    assert [s["collections"] for s in gc.get_stats()] == passes  # nothing walked
    thaw()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_state", "thawed")
def test_a_frozen_cycle_is_collected_once_thawed() -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    assert settle(SETTLE_MIN_OBJECTS)
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: no collection looks at it
    thaw()
    gc.collect()
    assert gone() is None


@pytest.mark.usefixtures("collector_state", "thawed")
def test_settle_started_collects_garbage_then_freezes_what_lives() -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b  # a cycle: garbage only the collector frees
    kept = [object()]
    frozen = settle_started()
    assert gone() is None  # collected, not frozen for good
    assert frozen == gc.get_freeze_count() > 0
    assert not in_a_generation(kept) and gc.is_tracked(kept)  # no later pass walks it

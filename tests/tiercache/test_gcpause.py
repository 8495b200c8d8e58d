"""The collector pause of bulk builds: off inside, restored after (also on error); one full collection after a
large build only."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tiercache.gcpause import SETTLE_MIN_OBJECTS, collector_paused, settle


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


@pytest.mark.usefixtures("collector_state")
def test_settle_collects_fully_only_after_a_large_build() -> None:
    gc.disable()  # no automatic pass can count as one of settle's
    full = gc.get_stats()[2]["collections"]
    settle(SETTLE_MIN_OBJECTS - 1)
    assert gc.get_stats()[2]["collections"] == full
    settle(SETTLE_MIN_OBJECTS)
    assert gc.get_stats()[2]["collections"] == full + 1

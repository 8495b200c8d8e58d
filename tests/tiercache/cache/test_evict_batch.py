"""Mover.reserve evicts the victims that need no demotion in one tier call, and exactly those that one
eviction at a time would: oldest first, no more than the room asked for, stopping at one that must be
demoted (which is demoted as before)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.tiercache.cache.movers import NBYTES, cid, intact, mover_over, store
from tiercache.cache.index import Index
from tiercache.cache.mover import Mover
from tiercache.errors import CapacityError
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L1, L3 = TierLevel.L1, TierLevel.L3


class CountingLmdbTier(LmdbTier):
    """The real L3 tier, recording the ids of each ``delete`` call."""

    def __init__(self, config: LmdbTierConfig) -> None:
        super().__init__(config)
        self.deletes: list[list[bytes]] = []
        self.fail_deletes = 0

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """Fault injection: the next ``fail_deletes`` calls fail as a full map does, removing nothing."""
        self.deletes.append(list(chunk_ids))
        if self.fail_deletes:
            self.fail_deletes -= 1
            raise CapacityError("injected: L3 LMDB map is full; could not delete")
        return super().delete(chunk_ids)


Parts = tuple[Mover, Index, dict[TierLevel, StorageTier], CountingLmdbTier]


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    l3 = CountingLmdbTier(
        LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=8 * (NBYTES + HEADER_BYTES))
    )
    tiers: dict[TierLevel, StorageTier] = {
        L1: HbmTier(HbmTierConfig(capacity_bytes=4 * NBYTES, slot_bytes=NBYTES, device="cpu")),
        L3: l3,
    }
    mover, index = mover_over(tiers)
    yield mover, index, tiers, l3
    for tier in tiers.values():
        tier.close()


def test_a_full_l3_evicts_the_oldest_in_one_delete_and_no_more(parts: Parts) -> None:
    mover, index, tiers, l3 = parts
    for i in range(1, 9):
        store(index, tiers, L3, i)
    slots = mover.reserve(L3, [cid(20), cid(21), cid(22)], [NBYTES] * 3)
    l3.abort(slots)
    assert l3.deletes == [[cid(1), cid(2), cid(3)]]
    assert [i for i in range(1, 9) if index.get(cid(i)) is None] == [1, 2, 3]
    assert index.counters[L3].evictions == 3 and l3.usage().chunks == 5
    assert intact(l3, [4, 5, 6, 7, 8])


def test_the_batch_stops_at_a_victim_that_must_be_demoted(parts: Parts) -> None:
    mover, index, tiers, l3 = parts
    store(index, tiers, L1, 1)
    store(index, tiers, L3, 1)  # written down: its L1 copy goes without a demotion
    store(index, tiers, L1, 2)  # only in L1: demoted to L3 when evicted
    store(index, tiers, L1, 3)
    store(index, tiers, L1, 4)
    slots = mover.reserve(L1, [cid(20), cid(21)], [NBYTES] * 2)
    tiers[L1].abort(slots)
    e1, e2 = index.get(cid(1)), index.get(cid(2))
    assert e1 is not None and e1.levels == (L3,) and e2 is not None and e2.levels == (L3,)
    assert index.counters[L1].evictions == 2 and index.counters[L3].demotions == 1
    assert intact(l3, [1, 2]) and intact(tiers[L1], [3, 4])


def test_a_failed_delete_keeps_every_victim_indexed_and_evictable(parts: Parts) -> None:
    mover, index, tiers, l3 = parts
    for i in range(1, 9):
        store(index, tiers, L3, i)
    l3.fail_deletes = 1
    with pytest.raises(CapacityError, match="injected"):
        mover.reserve(L3, [cid(20), cid(21), cid(22)], [NBYTES] * 3)
    assert all(index.get(cid(i)) is not None for i in range(1, 9)) and index.counters[L3].evictions == 0
    assert intact(l3, list(range(1, 9)))
    slots = mover.reserve(L3, [cid(20), cid(21), cid(22)], [NBYTES] * 3)  # the same victims, queued again
    l3.abort(slots)
    assert l3.deletes == [[cid(1), cid(2), cid(3)]] * 2
    assert [i for i in range(1, 9) if index.get(cid(i)) is None] == [1, 2, 3]
    assert intact(l3, [4, 5, 6, 7, 8])

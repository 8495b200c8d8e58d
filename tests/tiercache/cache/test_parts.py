"""Unit tests of the cache core's parts: victim queues, space, index, lease table, mover abort paths."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.tiercache.cache.movers import NBYTES, cid, mover_over, store
from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.leases import Lease, LeaseTable, StoreReservation
from tiercache.cache.mover import MoveOutcome, Mover
from tiercache.cache.space import Space, VictimQueue
from tiercache.errors import CapacityError
from tiercache.policies import Candidate, LfuPolicy, LruPolicy
from tiercache.stats import ChunkEvent, EventKind
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L1, L2, L3 = TierLevel.L1, TierLevel.L2, TierLevel.L3


# ---------------------------------------------------------------- VictimQueue


def test_queue_pops_in_priority_then_id_order_and_skips_ineligible() -> None:
    q = VictimQueue()
    q.push(cid(3), (1, 0))
    q.push(cid(1), (2, 0))
    q.push(cid(2), (1, 0))
    assert q.ordered() == [cid(2), cid(3), cid(1)]
    assert q.pop_min(lambda c: c != cid(2)) == cid(3)  # cid(2) refused: it stays queued
    assert cid(2) in q and cid(3) not in q
    assert q.pop_min(lambda c: True) == cid(2)
    assert q.pop_min(lambda c: False) is None and len(q) == 1


def test_queue_stays_consistent_under_random_updates() -> None:
    """Lazy invalidation never returns a stale priority; the heap stays bounded by the live chunks."""
    rnd = random.Random(5)
    q = VictimQueue()
    model: dict[bytes, tuple[int, ...]] = {}
    for _ in range(3000):
        c = cid(rnd.randrange(40))
        op = rnd.random()
        if op < 0.5:
            prio = (rnd.randrange(20), -rnd.randrange(3))
            q.push(c, prio)
            model[c] = prio
        elif op < 0.75:
            q.discard(c)
            model.pop(c, None)
        else:
            want = min(model.items(), key=lambda kv: (kv[1], kv[0]))[0] if model else None
            assert q.pop_min(lambda _: True) == want
            if want is not None:
                del model[want]
        assert len(q) == len(model)
        assert q.heap_size() <= 2 * len(model) + 64 + 1
    assert q.ordered() == sorted(model, key=lambda c: (model[c], c))


# ---------------------------------------------------------------- Space and Index


class Books:
    """An index over a space with recorded events (no tiers: the index never touches one)."""

    def __init__(self, policy: LruPolicy | LfuPolicy, min_residency_s: float = 0.0) -> None:
        self.events: list[ChunkEvent] = []
        self.space = Space([L1, L2], policy, min_residency_s)
        self.index = Index([L1, L2], self.space, self.events.append)

    def add(self, i: int, level: TierLevel = L1, depth: int = 0, now: float = 0.0) -> ChunkEntry:
        self.index.next_tick()
        entry = self.index.get(cid(i)) or ChunkEntry(b"n" * 16, cid(i), depth, NBYTES)
        return self.index.add_residency(cid(i), entry, level, now)

    def victims(self, level: TierLevel = L1, now: float = 100.0) -> list[bytes]:
        out = []
        while (
            v := self.space.victim(level, now, self.index.entries, self.index.pinned_namespaces)
        ) is not None:
            out.append(v)
        return out


def test_lru_order_is_last_access_then_deepest() -> None:
    b = Books(LruPolicy())
    b.index.next_tick()
    for i, depth in ((1, 0), (2, 1), (3, 2)):  # one operation: they share a tick
        entry = ChunkEntry(b"n" * 16, cid(i), depth, NBYTES)
        b.index.add_residency(cid(i), entry, L1, 0.0)
    b.add(4)
    b.index.next_tick()
    first = b.index.get(cid(1))
    assert first is not None
    b.index.touch(cid(1), first, L1)
    assert b.victims() == [cid(3), cid(2), cid(4), cid(1)]


def test_a_demoted_copy_ranks_by_the_last_use_of_the_copy_it_replaced() -> None:
    b = Books(LruPolicy())
    e1 = b.add(1)  # tick 1, in L1
    b.add(2, level=L2)  # tick 2, in L2
    b.index.next_tick()
    b.index.add_residency(cid(1), e1, L2, 0.0, source=L1)  # demoted at tick 3 ...
    b.index.remove_residency(cid(1), e1, L1, evicted=True)  # ... its L1 copy evicted
    b.space.backdate(cid(1), e1, L2, 1)
    assert b.victims(L2) == [cid(1), cid(2)]  # last used at tick 1, before chunk 2


def test_lfu_order_is_hits_then_access_then_deepest() -> None:
    b = Books(LfuPolicy())
    for i in range(1, 4):
        b.add(i)
    e1, e2 = b.index.get(cid(1)), b.index.get(cid(2))
    assert e1 is not None and e2 is not None
    b.index.record_hit(cid(1), e1, L1)
    b.index.record_hit(cid(1), e1, L1)
    b.index.record_hit(cid(2), e2, L1)
    assert b.victims() == [cid(3), cid(2), cid(1)]


def test_held_pinned_young_and_pinned_namespaces_are_never_chosen() -> None:
    b = Books(LruPolicy(), min_residency_s=10.0)
    held, pinned, young, free = b.add(1), b.add(2), b.add(3, now=95.0), b.add(4)
    b.index.hold(cid(1), held, L1)
    assert b.index.pin([cid(2)], True) == 1
    assert b.victims(now=100.0) == [cid(4)]
    assert b.victims(now=100.0) == []  # young stays queued, held and pinned are out of the queue
    assert b.space.queue(L1).ordered() == [cid(3)]
    b.index.unhold(cid(1), L1)
    b.index.pin([cid(2)], False)
    b.index.pin_namespace(b"n" * 16, True)
    assert b.victims(now=200.0) == []
    b.index.pin_namespace(b"n" * 16, False)
    assert b.victims(now=200.0) == [cid(1), cid(2), cid(3)]
    assert young.copy(L1).holds == 0 and pinned.hits == 0 and free.levels == (L1,)


def test_remove_and_purge_keep_queue_and_index_consistent() -> None:
    b = Books(LruPolicy())
    e1 = b.add(1)
    b.add(1, level=L2)
    e2 = b.add(2)
    b.index.hold(cid(2), e2, L1)
    assert b.index.purge(e2, cid(2)) == []  # held: nothing can go yet
    assert b.index.visible(cid(2)) is None and b.index.get(cid(2)) is e2
    assert b.index.unhold(cid(2), L1)  # last hold of a purged chunk: it should go now
    b.index.remove_residency(cid(2), e2, L1, evicted=False)
    assert b.index.get(cid(2)) is None and cid(2) not in b.space.queue(L1)
    b.index.remove_residency(cid(1), e1, L1, evicted=True)
    assert b.index.counters[L1].evictions == 1 and b.index.get(cid(1)) is e1
    assert b.space.queue(L1).ordered() == [] and b.space.queue(L2).ordered() == [cid(1)]
    kinds = [(e.kind, e.level) for e in b.events]
    assert kinds[-2:] == [(EventKind.REMOVED, L1), (EventKind.REMOVED, L1)]


def test_a_lookup_stops_at_a_purged_chunk_only_while_one_is_filed() -> None:
    # The walk tests entries for being purged only while a purged one is filed (a held copy keeps it):
    # a chain with a purged chunk in the middle is cut there, before and after the copy of another goes.
    b = Books(LruPolicy())
    e1, e2, e3 = b.add(1), b.add(2), b.add(3)
    chain = [cid(1), cid(2), cid(3)]
    assert b.index.cached_prefix(chain) == [e1, e2, e3]
    b.index.hold(cid(2), e2, L1)
    assert b.index.purge(e2, cid(2)) == []
    assert b.index.cached_prefix(chain) == [e1]
    assert b.index.lookup(chain)[0].chunks == 1
    b.index.remove_residency(cid(3), e3, L1, evicted=True)  # another chunk leaving changes nothing
    assert b.index.cached_prefix(chain) == [e1]
    moved = ChunkEntry(e2.namespace_id, cid(2), 0, NBYTES)  # a copy joining the purged entry stays unseen
    assert b.index.add_residency(cid(2), moved, L2, 0.0) is e2
    assert b.index.cached_prefix(chain) == [e1]
    b.index.remove_residency(cid(2), e2, L2, evicted=False)
    assert b.index.unhold(cid(2), L1)
    b.index.remove_residency(cid(2), e2, L1, evicted=False)
    assert b.index.get(cid(2)) is None
    e2 = b.add(2)  # stored again: visible, the chain walks on to the missing third chunk
    assert b.index.cached_prefix(chain) == [e1, e2]


def test_candidate_priority_feeds_the_queue() -> None:
    b = Books(LfuPolicy())
    e = b.add(7, depth=3)
    assert b.space.queue(L1).priority(cid(7)) == LfuPolicy().priority(Candidate(e.copy(L1).last_access, 3, 0))


# ---------------------------------------------------------------- LeaseTable


def test_lease_table_reaps_at_ttl_only_what_is_open() -> None:
    t = LeaseTable()
    ids = [t.new_id() for _ in range(4)]
    assert len(set(ids)) == 4 and 0 not in ids
    t.add_lease(ids[0], Lease(L1, [cid(1)], 10.0))
    t.add_lease(ids[1], Lease(L1, [cid(2)], 20.0))
    t.add_store(ids[2], StoreReservation(b"n" * 16, L1, [], [], [], 15.0))
    t.add_store(ids[3], StoreReservation(b"n" * 16, L1, [], [], [], 30.0))
    assert t.take_lease(ids[0]) is not None  # released before its TTL: never reaped
    assert t.reap(9.0) == ([], [])
    leases, stores = t.reap(20.0)
    assert [i for i, _ in leases] == [ids[1]] and [i for i, _ in stores] == [ids[2]]
    assert t.expired == 2 and t.active_leases == 0 and t.take_lease(ids[1]) is None
    assert [s.expires_at for s in t.stores()] == [30.0]


# ---------------------------------------------------------------- Mover abort paths


@pytest.fixture
def mover_parts(tmp_path: Path) -> Iterator[tuple[Mover, Index, dict[TierLevel, StorageTier]]]:
    tiers: dict[TierLevel, StorageTier] = {
        L1: HbmTier(HbmTierConfig(capacity_bytes=2 * NBYTES, slot_bytes=NBYTES, device="cpu")),
        L3: LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=4 * (NBYTES + HEADER_BYTES))),
    }
    mover, index = mover_over(tiers)
    yield mover, index, tiers
    for tier in tiers.values():
        tier.close()


def _reserved(tiers: dict[TierLevel, StorageTier]) -> list[int]:
    return [t.usage().reserved_bytes for t in tiers.values()]


def test_a_lost_source_aborts_the_reservation_and_drops_the_copy(
    mover_parts: tuple[Mover, Index, dict[TierLevel, StorageTier]],
) -> None:
    mover, index, tiers = mover_parts
    store(index, tiers, L3, 1)
    tiers[L3].delete([cid(1)])  # the index still believes L3 has it
    assert mover.move_outcome(cid(1), L1) is MoveOutcome.LOST
    assert _reserved(tiers) == [0, 0] and index.get(cid(1)) is None
    assert mover.copying() == set() and tiers[L1].usage().chunks == 0


def test_no_room_releases_the_source_hold(
    mover_parts: tuple[Mover, Index, dict[TierLevel, StorageTier]],
) -> None:
    mover, index, tiers = mover_parts
    for i in (1, 2):
        store(index, tiers, L1, i)
        entry = index.get(cid(i))
        assert entry is not None
        index.hold(cid(i), entry, L1)  # both L1 chunks leased: nothing evictable
    store(index, tiers, L3, 3)
    assert mover.move_outcome(cid(3), L1) is MoveOutcome.NO_ROOM
    entry = index.get(cid(3))
    assert entry is not None and entry.copy(L3).holds == 0 and _reserved(tiers) == [0, 0]
    with pytest.raises(CapacityError, match="leased, pinned"):
        mover.reserve(L1, [cid(9)], [NBYTES])


def test_a_failing_copy_aborts_and_releases(
    mover_parts: tuple[Mover, Index, dict[TierLevel, StorageTier]],
) -> None:
    mover, index, tiers = mover_parts
    store(index, tiers, L1, 1)
    l3 = tiers[L3]

    def broken_commit(slots: object) -> None:
        raise OSError("disk full")

    l3.commit = broken_commit  # type: ignore[method-assign]
    with pytest.raises(OSError, match="disk full"):
        mover.move(cid(1), L3)
    entry = index.get(cid(1))
    assert entry is not None and entry.copy(L1).holds == 0 and not entry.has_copy(L3)
    assert _reserved(tiers) == [0, 0] and mover.copying() == set()


def test_eviction_demotes_with_the_copy_outside_and_drops_the_victim(
    mover_parts: tuple[Mover, Index, dict[TierLevel, StorageTier]],
) -> None:
    mover, index, tiers = mover_parts
    store(index, tiers, L1, 1)
    store(index, tiers, L1, 2)
    (ws,) = mover.reserve(L1, [cid(3)], [NBYTES])
    tiers[L1].abort([ws])
    e1 = index.get(cid(1))
    assert e1 is not None and e1.levels == (L3,)  # demoted to L3 (on-evict), then dropped from L1
    got = torch.empty(NBYTES, dtype=torch.uint8)
    assert tiers[L3].read_into([cid(1)], [got]) == [True] and bool((got == 1).all())
    assert index.counters[L1].evictions == 1 and index.counters[L3].demotions == 1

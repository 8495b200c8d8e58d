"""The bulk warm start of the index: victim queues filled at once, chunks filed in the tier's order.

A queue filled with ``push_many`` behaves exactly like one filled push by push (also mixed with later pushes
and discards); an index rebuilt over a real L3 files every chunk once, in the tier's use order (one tick
each), with its stored depth, shares one namespace id object per namespace, ranks its victims least
recently used first and announces them to the tenants' books once per tier, as counts by namespace; a
cache restarted on its L3 shows each tenant the chunks and bytes it held before.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch

from tiercache import gcpause
from tiercache.cache import CacheManager
from tiercache.cache.index import Index
from tiercache.cache.space import Space, VictimQueue
from tiercache.keys import NAMESPACE_ID_BYTES, Namespace, chunk_keys
from tiercache.policies import LruPolicy
from tiercache.stats import ChunkEvent
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L3 = TierLevel.L3


def _cid(ns: int, i: int) -> bytes:
    return bytes([ns]) * NAMESPACE_ID_BYTES + i.to_bytes(4, "big") * 8


def test_push_many_is_the_same_queue_as_pushes() -> None:
    rnd = random.Random(3)
    items = [(_cid(0, rnd.randrange(50)), (rnd.randrange(9), -rnd.randrange(3))) for _ in range(200)]
    one, bulk = VictimQueue(), VictimQueue()
    for cid, priority in items:
        one.push(cid, priority)
    bulk.push_many([(*priority, cid) for cid, priority in items])
    assert bulk.ordered() == one.ordered() and len(bulk) == len(one)
    for queue in (one, bulk):  # later changes land the same way on both
        queue.discard(items[0][0])
        queue.push(items[1][0], (-1, 0))
    popped = [[q.pop_min(lambda _: True) for _ in range(len(q) + 1)] for q in (one, bulk)]
    assert popped[0] == popped[1] and popped[0][0] == items[1][0] and popped[0][-1] is None


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_push_many_into_an_empty_queue_in_any_order_pops_smallest_first(order: str) -> None:
    items = [(0, -t, -(t % 3), _cid(1, t)) for t in range(100)]
    items.sort(reverse=order == "descending")
    if order == "shuffled":
        random.Random(5).shuffle(items)
    queue = VictimQueue()
    queue.push_many(list(items))
    queue.push(_cid(2, 0), (0, -50, 0))  # later pushes land in the same heap
    assert len(queue) == 101 and queue.priority(_cid(1, 7)) == (0, -7, -1)
    expected = [item[-1] for item in sorted([*items, (0, -50, 0, _cid(2, 0))])]
    assert [queue.pop_min(lambda _: True) for _ in range(101)] == expected


def test_rebuild_files_the_l3_chunks_in_use_order_with_depths(tmp_path: Path) -> None:
    config = LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 20)
    cids = [_cid(ns, i) for i in range(5) for ns in (1, 2)]
    tier = LmdbTier(config)
    tier.bind_depths(lambda cid: int.from_bytes(cid[-4:], "big"))
    for cid in cids:
        slots = tier.reserve([cid], [64])
        slots[0].buffer.fill_(1)
        tier.commit(slots)
    tier.close()

    tier = LmdbTier(config)
    try:
        held = tier.depth_entries()  # the tier's entries as columns, with the depths stored at commit
        assert list(zip(held.ids, held.nbytes, strict=True)) == tier.entries()
        assert held.depths == [int.from_bytes(cid[-4:], "big") for cid in held.ids]
        events: list[ChunkEvent] = []
        announced: list[tuple[TierLevel, dict[bytes, int]]] = []
        space = Space([L3], LruPolicy(), min_residency_s=0.0)
        index = Index([L3], space, events.append)
        index.rebuild({L3: tier}, lambda level, counts: announced.append((level, dict(counts))))
        assert list(index) == cids and len(index) == len(cids)
        entries = [index.get(cid) for cid in cids]
        assert all(e is not None for e in entries)
        ticks = [e.copy(L3).last_access for e in entries if e is not None]
        assert ticks == sorted(ticks) and len(set(ticks)) == len(cids)
        assert [e.depth for e in entries if e is not None] == [i for i in range(5) for _ in (1, 2)]
        by_ns = {
            ns: {id(e.namespace_id) for e in entries if e is not None and e.namespace_id[0] == ns}
            for ns in (1, 2)
        }
        assert all(len(ids) == 1 for ids in by_ns.values())  # one namespace id object per namespace
        assert space.queue(L3).ordered() == cids  # least recently used first
        assert events == []  # no event per chunk: one count per namespace
        assert announced == [(L3, {bytes([1]) * NAMESPACE_ID_BYTES: 5, bytes([2]) * NAMESPACE_ID_BYTES: 5})]
    finally:
        tier.close()


def _tenant_books(cache: CacheManager, tenant: str) -> Mapping[TierLevel, tuple[int, int, int]]:
    stats = cache.stats(tenant)
    return {t.level: (t.chunks, t.used_bytes, t.payload_bytes) for t in stats.tiers}


def test_a_restart_shows_each_tenant_the_chunks_it_held(tmp_path: Path, namespace: Namespace) -> None:
    nbytes = namespace.layout.chunk_bytes

    def open_cache() -> CacheManager:
        l2 = HostTier(HostTierConfig(4 * nbytes, nbytes, "tiercache-test"))
        l3 = LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=40 * (HEADER_BYTES + nbytes)))
        return CacheManager([l2, l3])

    cache = open_cache()
    try:
        ids = {t: cache.register_namespace(namespace, t) for t in ("a", "b")}
        for tenant, n in (("a", 3), ("b", 5)):
            keys = chunk_keys(namespace, list(range(n * namespace.layout.chunk_tokens)))
            cache.put(ids[tenant], keys, [torch.full((nbytes,), 7, dtype=torch.uint8) for _ in keys])
        cache.flush()
        before = {t: _tenant_books(cache, t)[L3] for t in ids}
        assert before["a"][0] == 3 and before["b"][0] == 5
    finally:
        cache.close()
    cache = open_cache()
    try:
        assert cache.stats().tier(L3).chunks == 8
        again = {t: cache.register_namespace(namespace, t) for t in ("b", "a")}
        assert again == ids
        assert {t: _tenant_books(cache, t)[L3] for t in ids} == before
        assert {t: _tenant_books(cache, t)[TierLevel.L2][0] for t in ids} == {"a": 0, "b": 0}
    finally:
        cache.close()


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("thawed")
def test_a_large_warm_start_freezes_the_collector_until_the_cache_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 20)
    tier = LmdbTier(config)
    for cid in [_cid(1, i) for i in range(4)]:
        slots = tier.reserve([cid], [64])
        slots[0].buffer.fill_(1)
        tier.commit(slots)
    tier.close()
    monkeypatch.setattr(gcpause, "SETTLE_MIN_OBJECTS", 4)  # these 4 chunks count as a large build
    cache = CacheManager([LmdbTier(config)])
    try:
        assert cache.stats().tier(L3).chunks == 4
        assert gc.get_freeze_count() > 0  # the index (and all else) is out of the collector's walks
    finally:
        cache.close()
    assert gc.get_freeze_count() == 0  # given back: a closed cache's cycles can be collected
    monkeypatch.setattr(gcpause, "SETTLE_MIN_OBJECTS", 5)
    cache = CacheManager([LmdbTier(config)])
    try:
        assert gc.get_freeze_count() == 0  # a small build leaves the collector alone
    finally:
        cache.close()

"""An L3 whose LMDB map fills up while evictions demote into it (real tiers, real LMDB under tmp_path).

L2 holds four chunks; every store evicts one, whose demotion writes it into L3. L3's accounting capacity is
large but its LMDB map is tiny, so after a few dozen demotions every commit finds the map full. Each of those
demotions must give its reservation back, count the chunk it drops, and never fail the store that evicted
it; nothing stored may ever come back with a wrong byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.daemon.metrics import StatsCollector
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.wire.stats import stats_to_proto

L2, L3 = TierLevel.L2, TierLevel.L3
STORES = 200
MAP_BYTES = 256 << 10


def payload_for(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def full_l3(tmp_path: Path, namespace: Namespace) -> Iterator[tuple[CacheManager, LmdbTier]]:
    nbytes = namespace.layout.chunk_bytes
    l2 = HostTier(HostTierConfig(capacity_bytes=4 * nbytes, slot_bytes=nbytes, segment_prefix="tc-l3full"))
    l3 = LmdbTier(
        LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=64 << 20, map_size_bytes=MAP_BYTES)
    )
    cache = CacheManager([l2, l3], CacheConfig(write_policy=WritePolicyKind.ON_EVICT))
    yield cache, l3
    cache.close()


def test_demotions_into_a_full_lmdb_map_leak_nothing_and_count_every_drop(
    full_l3: tuple[CacheManager, LmdbTier], namespace: Namespace
) -> None:
    cache, l3 = full_l3
    ns_id = cache.register_namespace(namespace)
    nbytes = namespace.layout.chunk_bytes
    tokens = namespace.layout.chunk_tokens
    keys = [chunk_keys(namespace, list(range(i * 1000, i * 1000 + tokens)))[0] for i in range(STORES)]
    for i, key in enumerate(keys):
        assert cache.put(ns_id, [key], [payload_for(key, nbytes)]) == 1
        assert l3.usage().reserved_bytes == 0, f"a reservation leaked at store {i}"

    stats = cache.stats()
    in_l3 = l3.usage().chunks
    assert 0 < in_l3 < STORES - 4, "the map never filled: the scenario did not happen"
    # Every evicted chunk either reached L3 or is counted as dropped at L2; none vanished quietly.
    assert stats.tier(L3).demotions == in_l3
    assert stats.tier(L2).dropped_chunks == STORES - 4 - in_l3
    assert stats.tier(L2).evictions == STORES - 4
    assert l3.usage().reserved_bytes == 0

    served = 0
    for key in keys:
        got = cache.get(ns_id, [key])[0]
        if got is not None:
            assert torch.equal(got, payload_for(key, nbytes)), "served a wrong byte"
            served += 1
    assert served >= in_l3  # every chunk that reached L3 (L3 never evicts here: its capacity is large)
    assert l3.usage().reserved_bytes == 0

    # Stores go on after the map is full, and the figure travels to the wire and to /metrics.
    more = chunk_keys(namespace, list(range(10**6, 10**6 + tokens)))[0]
    assert cache.put(ns_id, [more], [payload_for(more, nbytes)]) == 1
    got = cache.get(ns_id, [more])[0]
    assert got is not None and torch.equal(got, payload_for(more, nbytes))
    assert l3.usage().reserved_bytes == 0
    final = cache.stats()
    assert final.tier(L2).dropped_chunks > 0
    wire = {pb.Tier.Name(t.tier): t.dropped_chunks for t in stats_to_proto(final).tiers}
    assert wire == {"TIER_L2": final.tier(L2).dropped_chunks, "TIER_L3": final.tier(L3).dropped_chunks}
    families = {f.name: f for f in StatsCollector(lambda: final).collect()}
    samples = {
        s.labels["tier"]: s.value
        for s in families["tiercache_tier_dropped_chunks"].samples
        if s.name.endswith("_total")
    }
    assert samples == {"L2": final.tier(L2).dropped_chunks, "L3": final.tier(L3).dropped_chunks}

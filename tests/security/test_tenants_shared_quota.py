"""A per-tenant byte quota on the shared (Redis) tier, over a real redis-server.

The attack: the shared tier had no per-tenant quota, so one tenant's write-through copies could fill the
store every daemon of the fleet shares (the store's own LRU then evicted everybody's chunks alike). Now
``shared_bytes`` bounds a tenant's chunks there as ``l2_bytes`` does in L2: its stores trim its own shared
copies (deleted from the store), and another tenant within its share keeps every chunk.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.cache.quotas import QuotaTable, TenantQuota
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.testing.redis import RedisDeployment
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.shared_config import SharedTierConfig

SHARED = TierLevel.SHARED
SHARE = 4  # chunks


@pytest.fixture
def cache(tmp_path: Path, redis_single: RedisDeployment, namespace: Namespace) -> Iterator[CacheManager]:
    nbytes = namespace.layout.chunk_bytes
    prefix = f"quota-{secrets.token_hex(4)}:"
    made = build_cache(
        CacheBuildConfig(
            cache=CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH),
            l2=HostTierConfig(capacity_bytes=32 * nbytes, slot_bytes=nbytes, segment_prefix="tc-sq"),
            shared=SharedTierConfig(url=redis_single.url, key_prefix=prefix),
        )
    )
    try:
        yield made
    finally:
        made.close()


def _put(cache: CacheManager, ns_id: bytes, ns: Namespace, seed: int, n: int) -> list[bytes]:
    keys = chunk_keys(ns, [seed * 1_000_003 + i for i in range(n * ns.layout.chunk_tokens)])
    nbytes = ns.layout.chunk_bytes
    payloads = [torch.full((nbytes,), (seed + i) % 251, dtype=torch.uint8) for i in range(n)]
    assert cache.put(ns_id, keys, payloads) == n
    cache.flush(30)  # the write-through copies reach the store
    return keys


def _records(deployment: RedisDeployment, ns_id: bytes) -> int:
    """The records (header + payload keys) of a tenant's namespace in the store."""
    client = redis.Redis(host="127.0.0.1", port=deployment.nodes[0].port)
    try:
        return sum(1 for _ in client.scan_iter(match=f"*{{{ns_id.hex()}*".encode())) // 2
    finally:
        client.close()


def test_a_tenant_cannot_fill_the_shared_tier(
    cache: CacheManager, redis_single: RedisDeployment, namespace: Namespace
) -> None:
    charge = cache.tier(SHARED).charge(namespace.layout.chunk_bytes)
    cache.set_quotas(QuotaTable(default=TenantQuota(shared_bytes=SHARE * charge)))  # old code: no such quota
    ids = {t: cache.register_namespace(namespace, t) for t in ("a", "b")}
    a_keys = _put(cache, ids["a"], namespace, seed=1, n=2)
    for seed in range(10, 14):  # b writes 16 chunks through to the store: 4 times its share
        _put(cache, ids["b"], namespace, seed=seed, n=SHARE)
    assert cache.stats("b").tier(SHARED).used_bytes <= SHARE * charge
    assert 1 <= _records(redis_single, ids["b"]) <= SHARE  # in the store itself, not only in the books
    assert cache.lookup(ids["a"], a_keys).by_tier[SHARED] == 2  # a, within its share, keeps its chunks
    assert _records(redis_single, ids["a"]) == 2

"""A concurrent stress test over real tiers: every byte loaded is what was stored, and the books balance.

L1 on the CPU device, L2 in /dev/shm, L3 LMDB in a temp dir, all small so that eviction and demotion run
all the time; threads store, load (acquire + copy + release), get, promote, demote, pin and purge on
overlapping keys. No timing assertions.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import threading
from pathlib import Path

import torch

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.errors import CapacityError
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import SlotTier, TierLevel
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L1, L2, L3 = TierLevel.L1, TierLevel.L2, TierLevel.L3


def payload(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def check_invariants(cache: CacheManager) -> None:
    """No leaked leases, holds, reservations or copies; the index matches every tier's contents."""
    stats = cache.stats()
    assert stats.active_leases == 0 and stats.pending_writes == 0
    with cache._lock:
        assert cache._mover.copying() == set() and cache._mover.storing == set()
        assert cache._leases.stores() == []
        for level, tier in cache._tiers.items():
            assert tier.usage().reserved_bytes == 0, level
            indexed = {c for c, e in cache._index.entries.items() if e.has_copy(level)}
            assert {c for c, _ in tier.entries()} == indexed, level
            queue = cache._space.queue(level)
            for c, entry in cache._index.entries.items():
                if entry.has_copy(level):
                    assert entry.copy(level).holds == 0 and not entry.purged
                    assert (c in queue) == (not entry.pinned), (level, c)
            assert len(queue) == len(indexed) - sum(
                1 for e in cache._index.entries.values() if e.has_copy(level) and e.pinned
            )


def test_concurrent_operations_keep_bytes_and_books(tmp_path: Path, namespace: Namespace) -> None:
    n = namespace.layout.chunk_bytes
    cache = build_cache(
        CacheBuildConfig(
            cache=CacheConfig(write_policy=WritePolicyKind.ON_EVICT, lease_ttl_s=600.0, max_ttl_s=600.0),
            l1=HbmTierConfig(capacity_bytes=3 * n, slot_bytes=n, device="cpu"),
            l2=HostTierConfig(capacity_bytes=5 * n, slot_bytes=n, segment_prefix="tiercache-test-stress"),
            l3=LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=9 * (n + HEADER_BYTES)),
        )
    )
    try:
        ns_a = cache.register_namespace(namespace)
        ns_b = cache.register_namespace(namespace, tenant="b")
        keys = chunk_keys(namespace, list(range(20 * namespace.layout.chunk_tokens)))
        errors: list[BaseException] = []
        loaded = [0]
        count_lock = threading.Lock()

        def verify(key: bytes, got: torch.Tensor) -> None:
            assert torch.equal(got.cpu(), payload(key, n)), "a load returned other bytes than were stored"
            with count_lock:
                loaded[0] += 1

        def worker(seed: int) -> None:
            rnd = random.Random(seed)
            try:
                for _ in range(120):
                    ns = ns_a if rnd.random() < 0.8 else ns_b
                    i = rnd.randrange(len(keys) - 2)
                    part = keys[i : i + rnd.randint(1, 3)]
                    op = rnd.random()
                    with contextlib.suppress(CapacityError):
                        if op < 0.3:
                            cache.put(ns, part, [payload(k, n) for k in part], start_depth=i)
                        elif op < 0.5:
                            ticket = cache.acquire(ns, part, level=rnd.choice([L1, L2]))
                            try:
                                for ch in ticket.chunks:
                                    verify(ch.key, ch.view.clone())
                            finally:
                                cache.release(ticket.lease_id)
                        elif op < 0.7:
                            for key, got in zip(part, cache.get(ns, part)):
                                if got is not None:
                                    verify(key, got)
                        elif op < 0.8:
                            cache.promote(ns, part, rnd.choice([L1, L2]))
                        elif op < 0.9:
                            cache.demote(ns, part, rnd.choice([L2, L3]))
                        elif op < 0.97:
                            (cache.pin if rnd.random() < 0.5 else cache.unpin)(ns, part)
                        else:
                            cache.purge(ns_b)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, repr(errors[0])
        assert not any(t.is_alive() for t in threads)
        cache.flush()
        check_invariants(cache)
        assert loaded[0] > 0
        for ns in (ns_a, ns_b):
            for key, got in zip(keys, cache.get(ns, keys)):
                if got is not None:
                    verify(key, got)
        for level in (L1, L2):
            tier = cache._tiers[level]
            assert isinstance(tier, SlotTier)
            for key in keys:
                view = tier.view(chunk_id(ns_a, key))
                if view is not None:
                    assert torch.equal(view, payload(key, n))
    finally:
        cache.close()

"""The engine-facing rules over a real cache manager: L1 on the CPU device, L2 in shared memory, L3 in LMDB."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheManager, LoadTicket
from tiercache.cache.rules import DEVICE_LEVEL, SHARED_LEVEL, EngineRules
from tiercache.errors import CapacityError, NotFoundError
from tiercache.keys import Namespace, chunk_keys
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L1, L2, L3 = TierLevel.L1, TierLevel.L2, TierLevel.L3
WAIT_S = 30.0
"""Bound on waiting for a background promotion (a hang fails the test instead of blocking it)."""


def payload_for(key: bytes, nbytes: int) -> torch.Tensor:
    """Bytes derived from the key, so that any read can be checked."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


class Cache:
    """A manager over real tiers, its rules, and a registered namespace."""

    def __init__(self, tmp: Path, namespace: Namespace, l1: int, l2: int, l3: int) -> None:
        self.ns = namespace
        self.nbytes = namespace.layout.chunk_bytes
        tiers: list[StorageTier] = []
        if l1:
            tiers.append(
                HbmTier(HbmTierConfig(capacity_bytes=l1 * self.nbytes, slot_bytes=self.nbytes, device="cpu"))
            )
        tiers.append(
            HostTier(
                HostTierConfig(
                    capacity_bytes=l2 * self.nbytes, slot_bytes=self.nbytes, segment_prefix="tiercache-test"
                )
            )
        )
        tiers.append(
            LmdbTier(LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=l3 * (HEADER_BYTES + self.nbytes)))
        )
        self.manager = CacheManager(tiers)
        self.rules = EngineRules(self.manager)
        self.ns_id = self.manager.register_namespace(namespace)

    def keys(self, n: int, seed: int) -> list[bytes]:
        tokens = [seed * 1_000_003 + i for i in range(n * self.ns.layout.chunk_tokens)]
        return chunk_keys(self.ns, tokens)

    def store_in(self, level: TierLevel, keys: Sequence[bytes]) -> None:
        """Store chunks straight into one tier (the write policy writes nothing further down from L3)."""
        ticket = self.manager.begin_store(self.ns_id, keys, level)
        assert ticket.level == level
        for slot in ticket.slots:
            slot.buffer.copy_(payload_for(slot.key, self.nbytes))
        assert self.manager.commit_store(ticket.ticket_id) == len(keys)

    def in_tier(self, level: TierLevel, keys: Sequence[bytes]) -> int:
        return self.manager.lookup(self.ns_id, keys).by_tier[level]

    def check(self, ticket: LoadTicket) -> None:
        for chunk in ticket.chunks:
            assert torch.equal(chunk.view.cpu(), payload_for(chunk.key, self.nbytes)), "served a wrong byte"


@pytest.fixture
def make(tmp_path: Path, namespace: Namespace) -> Iterator[Callable[..., Cache]]:
    made: list[Cache] = []

    def build(l1: int = 4, l2: int = 4, l3: int = 16) -> Cache:
        tmp = tmp_path / f"c{len(made)}"
        tmp.mkdir()
        cache = Cache(tmp, namespace, l1, l2, l3)
        made.append(cache)
        return cache

    yield build
    for cache in made:
        cache.manager.close()


def test_the_levels_are_shared_memory_and_device() -> None:
    assert SHARED_LEVEL is L2 and DEVICE_LEVEL is L1


def test_shared_store_lands_in_shared_memory(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(3, seed=1)
    ticket = c.rules.begin_shared_store(c.ns_id, keys, None, 0)
    assert ticket.level == L2 and [s.index for s in ticket.slots] == [0, 1, 2]
    for slot in ticket.slots:
        slot.buffer.copy_(payload_for(slot.key, c.nbytes))
    assert c.manager.commit_store(ticket.ticket_id) == 3
    assert c.in_tier(L2, keys) == 3
    # Cached chunks are skipped, not reserved again.
    again = c.rules.begin_shared_store(c.ns_id, keys, None, 0)
    assert again.slots == () and again.skipped == (0, 1, 2)


def test_shared_store_without_room_in_shared_memory_is_refused_and_aborted(
    make: Callable[..., Cache],
) -> None:
    c = make(l2=2)
    held = c.keys(2, seed=2)
    c.store_in(L2, held)
    lease = c.rules.lease(c.ns_id, held)  # leased chunks cannot be evicted: L2 has no room left
    assert len(lease.chunks) == 2
    fresh = c.keys(1, seed=3)
    with pytest.raises(CapacityError, match="keys: no room in the shared-memory tier for 1 chunks"):
        c.rules.begin_shared_store(c.ns_id, fresh, None, 0)
    # The reservation the manager made below L2 was aborted: the chunk is free to store again.
    below = c.rules.begin_stream_store(c.ns_id, fresh[:1], 0)
    assert below.level == L3 and len(below.slots) == 1
    c.manager.abort_store(below.ticket_id)
    assert c.manager.release(lease.lease_id)
    assert c.manager.stats().active_leases == 0


def test_stream_store_lands_below_shared_memory_when_it_is_full(make: Callable[..., Cache]) -> None:
    c = make(l2=1)
    held = c.keys(1, seed=4)
    c.store_in(L2, held)
    lease = c.rules.lease(c.ns_id, held)
    key = c.keys(1, seed=5)[0]
    ticket = c.rules.begin_stream_store(c.ns_id, [key], 7)
    assert ticket.level == L3 and [s.index for s in ticket.slots] == [0]
    ticket.slots[0].buffer.copy_(payload_for(key, c.nbytes))
    assert c.manager.commit_store(ticket.ticket_id) == 1
    assert c.in_tier(L3, [key]) == 1
    c.manager.release(lease.lease_id)


def test_stream_store_prefers_shared_memory(make: Callable[..., Cache]) -> None:
    c = make()
    key = c.keys(1, seed=6)[0]
    ticket = c.rules.begin_stream_store(c.ns_id, [key], 0)
    assert ticket.level == L2
    c.manager.abort_store(ticket.ticket_id)


def test_lookup_with_prefetch_promotes_the_cached_prefix_into_shared_memory(
    make: Callable[..., Cache],
) -> None:
    c = make()
    keys = c.keys(3, seed=7)
    c.store_in(L3, keys[:2])  # the third chunk is not cached
    before = c.manager.stats().tier(L3).lookup_hit_tokens
    found = c.rules.lookup(c.ns_id, keys, prefetch=True)
    assert found.result.chunks == 2 and found.result.by_tier[L2] == 0 and found.result.by_tier[L3] == 2
    # An engine's lookup is counted in the token-weighted statistics.
    assert c.manager.stats().tier(L3).lookup_hit_tokens == before + 2 * c.ns.layout.chunk_tokens
    assert found.prefetch is not None and len(found.prefetch.futures) == 2
    assert [f.result(timeout=WAIT_S) for f in found.prefetch.futures] == [True, True]
    assert c.in_tier(L2, keys) == 2
    # Everything cached is in shared memory now: nothing more to start.
    assert c.rules.lookup(c.ns_id, keys, prefetch=True).prefetch is None


def test_lookup_without_prefetch_starts_nothing(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(2, seed=8)
    c.store_in(L3, keys)
    found = c.rules.lookup(c.ns_id, keys, prefetch=False)
    assert found.result.chunks == 2 and found.prefetch is None
    assert c.in_tier(L2, keys) == 0


def test_prefetch_promotes_into_shared_memory(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(2, seed=9)
    c.store_in(L3, keys)
    prefetch = c.rules.prefetch(c.ns_id, keys)
    assert [f.result(timeout=WAIT_S) for f in prefetch.futures] == [True, True]
    assert prefetch.ready() == 2 and c.in_tier(L2, keys) == 2 and c.in_tier(L1, keys) == 0


def test_lease_is_in_shared_memory_and_bit_exact(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(3, seed=10)
    c.store_in(L3, keys[:2])
    ticket = c.rules.lease(c.ns_id, keys)
    assert ticket.level == L2 and ticket.lease_id and [ch.index for ch in ticket.chunks] == [0, 1]
    assert [ch.source for ch in ticket.chunks] == [L3, L3]
    c.check(ticket)
    assert c.manager.release(ticket.lease_id)


def test_a_load_warms_the_device_tier(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(3, seed=11)
    c.store_in(L3, keys)
    ticket = c.rules.lease(c.ns_id, keys[:2])
    assert c.in_tier(L1, keys) == 0
    warm = c.rules.warm_after_load(c.ns_id, keys, ticket)
    assert warm is not None and len(warm.futures) == 2  # the leased prefix only
    assert [f.result(timeout=WAIT_S) for f in warm.futures] == [True, True]
    assert c.in_tier(L1, keys) == 2
    on_device = c.manager.acquire(c.ns_id, keys[:2], L1, None, 0)
    assert [ch.source for ch in on_device.chunks] == [L1, L1]
    c.check(on_device)
    c.manager.release(on_device.lease_id)
    c.manager.release(ticket.lease_id)


def test_nothing_is_warmed_without_a_lease_or_a_device_tier(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(1, seed=12)
    empty = c.rules.lease(c.ns_id, keys)  # nothing cached: nothing leased
    assert empty.lease_id == 0
    assert c.rules.warm_after_load(c.ns_id, keys, empty) is None

    no_device = make(l1=0)
    keys = no_device.keys(1, seed=13)
    no_device.store_in(L2, keys)
    ticket = no_device.rules.lease(no_device.ns_id, keys)
    assert ticket.lease_id and no_device.rules.warm_after_load(no_device.ns_id, keys, ticket) is None
    no_device.manager.release(ticket.lease_id)


def test_unknown_namespace_is_not_found(make: Callable[..., Cache]) -> None:
    c = make()
    keys = c.keys(1, seed=14)
    with pytest.raises(NotFoundError):
        c.rules.begin_shared_store(b"\x07" * 16, keys, None, 0)
    with pytest.raises(NotFoundError):
        c.rules.lookup(b"\x07" * 16, keys, prefetch=True)

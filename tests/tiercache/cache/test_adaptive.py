"""The adaptive eviction policy (the default) in a real cache: L1 on the CPU device, L3 in an LMDB file.

Each scenario is one that a fixed order loses: plain LRU on a cycle, the segmented order on reuse that
comes soon after one-off chunks, and both on a lower tier full of copies a faster tier holds anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.stats import ChunkEvent, EventKind
from tiercache.tiers.base import StorageTier, TierLevel
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L1, L3 = TierLevel.L1, TierLevel.L3
ADAPTIVE, LRU, SEGMENTED = EvictionPolicyKind.ADAPTIVE, EvictionPolicyKind.LRU, EvictionPolicyKind.SEGMENTED


def payload_for(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


class Cache:
    """A manager over an L1 of ``l1`` chunks and, when ``l3``, an L3 of that many chunks."""

    def __init__(self, tmp: Path, ns: Namespace, policy: EvictionPolicyKind, l1: int, l3: int) -> None:
        self.ns, self.nbytes = ns, ns.layout.chunk_bytes
        tiers: list[StorageTier] = [
            HbmTier(HbmTierConfig(capacity_bytes=l1 * self.nbytes, slot_bytes=self.nbytes, device="cpu"))
        ]
        if l3:
            path = str(tmp / f"l3-{policy.value}")
            tiers.append(
                LmdbTier(LmdbTierConfig(path=path, capacity_bytes=l3 * (HEADER_BYTES + self.nbytes)))
            )
        config = CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH, eviction_policy=policy)
        self.cache = CacheManager(tiers, config)
        self.ns_id = self.cache.register_namespace(ns)
        self.events: list[ChunkEvent] = []
        self.cache.subscribe(self.events.append)

    def keys(self, n: int, seed: int) -> list[bytes]:
        return chunk_keys(self.ns, [seed * 1_000_003 + i for i in range(n * self.ns.layout.chunk_tokens)])

    def put(self, keys: Sequence[bytes]) -> None:
        self.cache.put(self.ns_id, keys, [payload_for(k, self.nbytes) for k in keys])
        self.cache.flush()

    def serve(self, key: bytes) -> bool:
        """An engine's request for one chunk: a hit (right bytes), or a miss it recomputes and stores."""
        (got,) = self.cache.get(self.ns_id, [key])
        if got is None:
            self.put([key])
            return False
        assert torch.equal(got, payload_for(key, self.nbytes)), "served a wrong byte"
        return True

    def removed(self, level: TierLevel) -> list[bytes]:
        return [e.key for e in self.events if e.kind is EventKind.REMOVED and e.level == level and e.evicted]


@pytest.fixture
def make(tmp_path: Path, namespace: Namespace) -> Iterator[Callable[..., Cache]]:
    made: list[Cache] = []

    def factory(policy: EvictionPolicyKind, l1: int = 4, l3: int = 0) -> Cache:
        c = Cache(tmp_path, namespace, policy, l1, l3)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.cache.close()


def test_the_default_is_adaptive() -> None:
    assert CacheConfig().eviction_policy is ADAPTIVE


@pytest.mark.parametrize("policy", [LRU, ADAPTIVE])
def test_a_cycle_larger_than_the_cache_hits_under_adaptive(
    make: Callable[..., Cache], policy: EvictionPolicyKind
) -> None:
    c = make(policy)
    cycle = c.keys(6, seed=1)  # L1 holds 4
    hits = sum(c.serve(k) for _ in range(3) for k in cycle)
    if policy is LRU:
        assert hits == 0  # each chunk is evicted just before it comes back
    else:
        assert hits >= 2 * 3  # scan resistant from the start: a fixed part of the cycle stays


@pytest.mark.parametrize("policy", [SEGMENTED, ADAPTIVE])
def test_reuse_soon_after_one_offs_hits_under_adaptive(
    make: Callable[..., Cache], policy: EvictionPolicyKind
) -> None:
    c = make(policy)
    c.put(c.keys(4, seed=2))  # one-off chunks fill L1, never read
    hits = 0
    for turn in range(8):
        (fresh,) = c.keys(1, seed=100 + turn)
        (other,) = c.keys(1, seed=200 + turn)
        c.put([fresh])  # a chat's turn ...
        c.put([other])  # ... another session's ...
        hits += c.serve(fresh)  # ... and the chat's next turn, which reuses the first
    if policy is SEGMENTED:
        assert hits == 0  # the newest unread chunk always goes: the fresh turn, before it is reused
    else:
        assert hits >= 8 - 2  # recency would have hit: after a turn or two the fresh turns stay


@pytest.mark.parametrize("policy", [LRU, ADAPTIVE])
def test_a_lower_tier_drops_the_copies_a_faster_tier_holds_first(
    make: Callable[..., Cache], policy: EvictionPolicyKind
) -> None:
    c = make(policy, l1=2, l3=3)
    keys = c.keys(4, seed=3)
    for k in keys:
        c.put([k])  # write-through: every store lands in L1 and L3
    held = [c.cache.lookup(c.ns_id, [k]).chunks == 1 for k in keys]
    if policy is LRU:
        assert c.removed(L3) == keys[:1] and held == [False, True, True, True]  # L1 is a subset of L3
    else:
        # L1 holds keys[0] (kept: scan resistant) and keys[3]; L3 let keys[0], a duplicate, go first.
        assert c.removed(L3) == keys[:1] and c.removed(L1) == [keys[1], keys[2]]
        assert held == [True, True, True, True]  # four distinct chunks in 2 + 3 slots


def test_a_read_from_a_faster_tier_counts_for_the_slower_copy(make: Callable[..., Cache]) -> None:
    # L1 holds one chunk, L3 three. A and B are read, B before A, but B's L3 copy was written after A's.
    # When L3 must make room, A (used last) stays and B goes: a chunk's recency in L3 is its last use,
    # whichever tier served it, not the last read of the L3 copy (which L1 serves instead).
    c = make(ADAPTIVE, l1=1, l3=3)
    a, b, cc, d = c.keys(4, seed=4)
    c.put([a])
    c.put([b])  # L1 lets A go (L3 holds it)
    assert c.serve(b)  # read in L1
    ticket = c.cache.acquire(c.ns_id, [a])  # A promoted into L1 and read there, after B
    assert len(ticket.chunks) == 1
    c.cache.release(ticket.lease_id)
    c.put([cc])  # L1 lets A go again; L3 holds A, B, C: full
    assert c.serve(cc)
    c.put([d])  # L1 lets C go; D's write-down makes room in L3
    assert c.removed(L3) == [b]  # the stale order (L3 copies by write-down: A, B, C) took A
    assert c.serve(a)


def test_one_offs_left_by_segmented_mode_go_oldest_first_once_recency_wins(
    make: Callable[..., Cache],
) -> None:
    # The scenario of test_reuse_soon_after_one_offs_hits_under_adaptive: four one-off chunks fill L1
    # while the tier is scan resistant, then reuse turns it to recency. The one-offs still queued, ranked
    # newest first when they arrived, are re-ranked by recency: the oldest goes first.
    c = make(ADAPTIVE)
    one_offs = [c.keys(1, seed=10 + i)[0] for i in range(4)]
    for k in one_offs:
        c.put([k])
    for turn in range(8):
        (fresh,) = c.keys(1, seed=100 + turn)
        (other,) = c.keys(1, seed=200 + turn)
        c.put([fresh])
        c.put([other])
        c.serve(fresh)
    # The newest went while the tier was still scan resistant; after the turn, the other three go oldest
    # first (left in segmented rank, they would go newest first: 2, 1, 0).
    assert [k for k in c.removed(L1) if k in one_offs] == [one_offs[3], *one_offs[:3]]

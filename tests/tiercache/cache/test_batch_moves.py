"""Moves in batches, over real tiers (L2 in shared memory, L3 in an LMDB file).

An ``acquire`` that waits for its promotions brings the chunks of the cached prefix that L2 lacks in
together: one read of L3 for all of them, one reservation and one commit in L2. The tests check that it
does (the L3 tier counts the chunk ids each ``read_into`` asks for), that the leased bytes are exact and
each chunk says it came from L3, that a corrupt value in the batch ends the lease there and is never
served, that concurrent loads of one prompt read each chunk once, and that a prompt with no room for all
its chunks at once is still leased as far as the room goes, chunk by chunk.

The victims one reservation must demote go down together the same way: one L3 commit (one LMDB write
transaction) for all of them, each then read back exactly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.cache.results import LoadChunk
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import TierLevel, WriteSlot
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L2, L3 = TierLevel.L2, TierLevel.L3
CHUNKS = 6


class CountedL3(LmdbTier):
    """The real L3 tier, recording the chunk ids each ``read_into`` and ``commit`` call names."""

    def __init__(self, config: LmdbTierConfig) -> None:
        super().__init__(config)
        self.reads: list[list[bytes]] = []
        self.commits: list[list[bytes]] = []
        self._calls_lock = threading.Lock()

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        with self._calls_lock:
            self.reads.append(list(chunk_ids))
        return super().read_into(chunk_ids, dsts)

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        with self._calls_lock:
            self.commits.append([ws.chunk_id for ws in slots])
        super().commit(slots)


class Cache:
    """L2 of ``l2`` slots over a counted L3, a namespace, and prompts whose chunks live in L3 only."""

    def __init__(self, tmp: Path, namespace: Namespace, l2: int) -> None:
        self.ns = namespace
        self.nbytes = namespace.layout.chunk_bytes
        self.l2 = HostTier(
            HostTierConfig(
                capacity_bytes=l2 * self.nbytes, slot_bytes=self.nbytes, segment_prefix="tiercache-test-batch"
            )
        )
        self.l3 = CountedL3(LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=64 << 20))
        config = CacheConfig(write_policy=WritePolicyKind.ON_EVICT)
        self.cache = CacheManager([self.l2, self.l3], config)
        self.ns_id = self.cache.register_namespace(namespace)

    def prompt(self, seed: int) -> tuple[list[bytes], list[torch.Tensor]]:
        """The keys and bytes of a prompt of :data:`CHUNKS` chunks."""
        keys = chunk_keys(self.ns, [seed * 7919 + i for i in range(CHUNKS * self.ns.layout.chunk_tokens)])
        payloads = [
            torch.randint(
                0,
                256,
                (self.nbytes,),
                dtype=torch.uint8,
                generator=torch.Generator().manual_seed(seed * 100 + i),
            )
            for i in range(CHUNKS)
        ]
        return keys, payloads

    def in_l3(self, seed: int) -> tuple[list[bytes], list[torch.Tensor]]:
        """Store a prompt of :data:`CHUNKS` chunks and move it down to L3; its keys and bytes."""
        keys, payloads = self.prompt(seed)
        assert self.cache.put(self.ns_id, keys, payloads) == CHUNKS
        assert self.cache.demote(self.ns_id, keys, L3) == CHUNKS
        by_tier = self.cache.lookup(self.ns_id, keys).by_tier
        assert (by_tier.get(L2, 0), by_tier.get(L3, 0)) == (0, CHUNKS)
        self.l3.reads.clear()
        return keys, payloads

    def leased_bytes(self, chunks: Sequence[LoadChunk]) -> list[torch.Tensor]:
        """Copies of the leased chunks' bytes, read from L2's slots."""
        return [chunk.view.clone() for chunk in chunks]

    def corrupt(self, key: bytes) -> None:
        """Flip a payload byte of ``key``'s stored L3 value underneath the tier."""
        env = self.l3._env
        db = env.open_db(b"values")
        with env.begin(write=True, db=db) as txn:
            cid = chunk_id(self.ns_id, key)
            value = bytearray(txn.get(cid))
            value[HEADER_BYTES + 100] ^= 0x01
            txn.put(cid, bytes(value))


@pytest.fixture
def cache(tmp_path: Path, namespace: Namespace) -> Iterator[Cache]:
    c = Cache(tmp_path, namespace, l2=16)
    yield c
    c.cache.close()


def test_a_prompt_in_l3_is_read_in_one_call_and_leased_exactly(cache: Cache) -> None:
    keys, payloads = cache.in_l3(seed=1)

    ticket = cache.cache.acquire(cache.ns_id, keys, wait_s=None)

    assert [c.source for c in ticket.chunks] == [L3] * CHUNKS
    got = cache.leased_bytes(ticket.chunks)
    assert all(torch.equal(g, p) for g, p in zip(got, payloads, strict=True))
    assert cache.l3.reads == [[chunk_id(cache.ns_id, k) for k in keys]]  # one read of the whole batch
    l2 = cache.cache.stats().tier(L2)
    l3 = cache.cache.stats().tier(L3)
    assert (l2.misses, l2.promotions, l3.hits) == (CHUNKS, CHUNKS, CHUNKS)  # as chunk by chunk
    cache.cache.release(ticket.lease_id)


def test_a_corrupt_value_in_the_batch_ends_the_lease_and_is_never_served(cache: Cache) -> None:
    keys, payloads = cache.in_l3(seed=2)
    cache.corrupt(keys[3])

    ticket = cache.cache.acquire(cache.ns_id, keys, wait_s=None)

    assert len(ticket.chunks) == 3
    got = cache.leased_bytes(ticket.chunks)
    assert all(torch.equal(g, p) for g, p in zip(got, payloads[:3], strict=True))
    assert cache.cache.stats().tier(L3).corrupt_reads == 1
    assert cache.cache.lookup(cache.ns_id, keys).chunks == 3  # the corrupt chunk is gone from the index
    cache.cache.release(ticket.lease_id)


def load_together(cache: Cache, keys: list[bytes], callers: int) -> list[list[torch.Tensor]]:
    """Acquire ``keys`` from ``callers`` threads released at once; the bytes each leased."""
    start = threading.Barrier(callers)
    got: list[list[torch.Tensor]] = []

    def load() -> None:
        start.wait()
        ticket = cache.cache.acquire(cache.ns_id, keys, wait_s=None)
        got.append(cache.leased_bytes(ticket.chunks))
        cache.cache.release(ticket.lease_id)

    threads = [threading.Thread(target=load) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return got


def test_concurrent_loads_of_one_prompt_read_each_chunk_once(cache: Cache) -> None:
    for seed in range(10, 14):
        keys, payloads = cache.in_l3(seed=seed)

        got = load_together(cache, keys, 3)

        assert len(got) == 3
        for leased in got:
            assert len(leased) == CHUNKS
            assert all(torch.equal(g, p) for g, p in zip(leased, payloads, strict=True))
        read = [cid for call in cache.l3.reads for cid in call]
        assert sorted(read) == sorted(chunk_id(cache.ns_id, k) for k in keys)  # no chunk read twice


def test_a_prompt_without_room_for_all_at_once_is_leased_chunk_by_chunk(
    tmp_path: Path, namespace: Namespace
) -> None:
    small = Cache(tmp_path, namespace, l2=4)
    try:
        keys, payloads = small.in_l3(seed=3)

        ticket = small.cache.acquire(small.ns_id, keys, wait_s=None)

        assert len(ticket.chunks) == 4  # the room there is: the lease holds what it promoted
        got = small.leased_bytes(ticket.chunks)
        assert all(torch.equal(g, p) for g, p in zip(got, payloads[:4], strict=True))
        small.cache.release(ticket.lease_id)
    finally:
        small.cache.close()


def test_the_victims_of_one_store_are_demoted_in_one_l3_commit(cache: Cache) -> None:
    first = chunk_keys(cache.ns, list(range(16 * cache.ns.layout.chunk_tokens)))
    payloads = [
        torch.randint(0, 256, (cache.nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
        for i in range(16)
    ]
    assert cache.cache.put(cache.ns_id, first, payloads) == 16  # L2 is full; on-evict: nothing below yet
    assert cache.l3.commits == []

    later, _ = cache.prompt(seed=5)
    assert cache.cache.put(cache.ns_id, later, [payloads[0]] * CHUNKS) == CHUNKS

    ids = [chunk_id(cache.ns_id, k) for k in first]
    assert len(cache.l3.commits) == 1  # one transaction for the reservation's victims
    (victims,) = cache.l3.commits
    assert len(victims) == CHUNKS and set(victims) <= set(ids)
    assert cache.l3.contains(victims) == [True] * CHUNKS
    assert cache.l2.contains(victims) == [False] * CHUNKS
    demoted = [ids.index(v) for v in victims]
    got = cache.cache.get(cache.ns_id, [first[i] for i in demoted])
    assert all(g is not None and torch.equal(g, payloads[i]) for g, i in zip(got, demoted, strict=True))
    assert cache.cache.stats().tier(L3).demotions == CHUNKS

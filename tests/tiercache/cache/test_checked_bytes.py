"""Checked bytes and store-ticket expiry over real tiers: L2 in shared memory, L3 in an LMDB file.

Bytes flipped in the shared-memory segment after commit are never written down, copied out or (with
``verify_loads``) leased; a commit after its ticket's TTL is refused; an expired ticket's L2 slots are
quarantined for one more TTL so that a late writer cannot land in a slot handed on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.errors import ExpiredError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES, checksum, parse_header

L2, L3 = TierLevel.L2, TierLevel.L3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Cache:
    def __init__(self, tmp: Path, namespace: Namespace, verify_loads: bool = False, l2: int = 4) -> None:
        self.nbytes = namespace.layout.chunk_bytes
        self.ns = namespace
        self.clock = Clock()
        self.l2 = HostTier(
            HostTierConfig(
                capacity_bytes=l2 * self.nbytes,
                slot_bytes=self.nbytes,
                segment_prefix="tiercache-test-checked",
                verify_loads=verify_loads,
            )
        )
        self.l3 = LmdbTier(
            LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=8 * (HEADER_BYTES + self.nbytes))
        )
        config = CacheConfig(write_policy=WritePolicyKind.ON_EVICT)
        self.cache = CacheManager([self.l2, self.l3], config, clock=self.clock)
        self.ns_id = self.cache.register_namespace(namespace)

    def keys(self, n: int, seed: int = 0) -> list[bytes]:
        return chunk_keys(self.ns, [seed * 7919 + i for i in range(n * self.ns.layout.chunk_tokens)])

    def payload(self, i: int) -> torch.Tensor:
        return torch.randint(
            0, 256, (self.nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
        )

    def flip(self, key: bytes) -> None:
        """Flip one byte of a committed L2 chunk in the shared memory itself (as a stray writer would)."""
        cid = self.cache_id(key)
        slot = self.l2.slot_of(cid)
        assert slot is not None
        buf = self.l2._segment.buffer  # the daemon-side mapping of the named segment
        at = slot * self.l2.slot_bytes + 17
        buf[at] ^= 0xFF

    def cache_id(self, key: bytes) -> bytes:
        return self.ns_id + key

    def corrupt_reads(self) -> int:
        return self.cache.stats().tiers[0].corrupt_reads


@pytest.fixture
def cache(tmp_path: Path, namespace: Namespace) -> Iterator[Cache]:
    c = Cache(tmp_path, namespace)
    yield c
    c.cache.close()


def test_flipped_l2_bytes_are_never_written_down_or_served(cache: Cache) -> None:
    keys = cache.keys(2)
    assert cache.cache.put(cache.ns_id, keys, [cache.payload(0), cache.payload(1)]) == 2
    cache.flip(keys[0])
    assert cache.cache.demote(cache.ns_id, keys, L3) == 1  # only the intact chunk reaches L3
    assert cache.l3.contains([cache.cache_id(k) for k in keys]) == [False, True]
    assert cache.corrupt_reads() == 1
    found = cache.cache.lookup(cache.ns_id, keys)
    assert found.chunks == 0  # the chain now starts with a miss
    got = cache.cache.get(cache.ns_id, keys)
    assert got[0] is None
    assert got[1] is not None and torch.equal(got[1], cache.payload(1))


def test_a_flipped_chunk_copied_out_of_l2_is_a_miss_and_deleted(cache: Cache) -> None:
    keys = cache.keys(1, seed=3)
    cache.cache.put(cache.ns_id, keys, [cache.payload(5)])
    cache.flip(keys[0])
    assert cache.cache.get(cache.ns_id, keys) == [None]
    assert cache.corrupt_reads() == 1
    assert cache.l2.contains([cache.cache_id(keys[0])]) == [False]
    assert cache.cache.lookup(cache.ns_id, keys).chunks == 0


def test_l3_keeps_the_commit_time_checksum(cache: Cache) -> None:
    keys = cache.keys(1, seed=4)
    cache.cache.put(cache.ns_id, keys, [cache.payload(6)])
    cid = cache.cache_id(keys[0])
    committed = cache.l2._committed[cid].checksum  # taken when the chunk was committed into L2
    assert committed == checksum(memoryview(cache.payload(6).numpy()))
    assert cache.cache.demote(cache.ns_id, keys, L3) == 1
    env = cache.l3._env  # the real LMDB file underneath
    with env.begin(db=env.open_db(b"values")) as txn:
        header = parse_header(memoryview(txn.get(cid)))
    assert not isinstance(header, str) and header.checksum == committed
    (got,) = cache.cache.get(cache.ns_id, keys)  # read back from L3, verified against its header
    assert got is not None and torch.equal(got, cache.payload(6))


def test_verify_loads_refuses_to_lease_a_flipped_chunk(tmp_path: Path, namespace: Namespace) -> None:
    c = Cache(tmp_path, namespace, verify_loads=True)
    try:
        keys = c.keys(3, seed=9)
        c.cache.put(c.ns_id, keys, [c.payload(i) for i in range(3)])
        c.flip(keys[1])
        ticket = c.cache.acquire(c.ns_id, keys, level=L2)
        assert [ch.index for ch in ticket.chunks] == [0]  # the leased prefix stops before the bad chunk
        assert c.corrupt_reads() == 1
        assert c.cache.release(ticket.lease_id)
        assert c.cache.lookup(c.ns_id, keys).by_tier[L2] == 1
        assert c.cache.stats().active_leases == 0
    finally:
        c.cache.close()


def test_without_verify_loads_a_lease_does_not_read_the_bytes(cache: Cache) -> None:
    keys = cache.keys(1, seed=10)
    cache.cache.put(cache.ns_id, keys, [cache.payload(1)])
    cache.flip(keys[0])
    ticket = cache.cache.acquire(cache.ns_id, keys, level=L2)
    assert len(ticket.chunks) == 1 and cache.corrupt_reads() == 0  # the default: no check at load
    cache.cache.release(ticket.lease_id)


def test_a_commit_after_expiry_is_refused_and_names_the_ticket(cache: Cache) -> None:
    ticket = cache.cache.begin_store(cache.ns_id, cache.keys(1, seed=11), ttl_s=2.0)
    cache.clock.now += 3
    with pytest.raises(ExpiredError, match=f"ticket_id: store ticket {ticket.ticket_id} expired"):
        cache.cache.commit_store(ticket.ticket_id)


def test_expired_l2_slots_are_quarantined_for_one_more_ttl(tmp_path: Path, namespace: Namespace) -> None:
    c = Cache(tmp_path, namespace, l2=2)
    try:
        late = c.cache.begin_store(c.ns_id, c.keys(2, seed=12), ttl_s=2.0)
        assert late.level == L2
        late_slots = {s.slot for s in late.slots}
        c.clock.now += 2.5  # expired: its writer may still be writing into those two slots
        blocked = c.cache.begin_store(c.ns_id, c.keys(1, seed=14), ttl_s=2.0)
        assert blocked.level == L3  # no L2 slot is free: the quarantined ones are not handed on
        assert c.cache.abort_store(blocked.ticket_id)
        assert c.l2.usage().reserved_bytes == 2 * c.nbytes
        c.clock.now += 2.0  # one more TTL: the quarantine is over
        fresh = c.cache.begin_store(c.ns_id, c.keys(2, seed=13), ttl_s=2.0)
        assert fresh.level == L2 and {s.slot for s in fresh.slots} == late_slots
        assert c.cache.abort_store(fresh.ticket_id)
    finally:
        c.cache.close()

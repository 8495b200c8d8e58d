"""Failed moves leave no reservation behind and count the chunk they dropped (real L2 and L3 tiers).

Each failure is injected inside a real tier: the LMDB write transaction raises, or the source tier's read
raises; the mover, the stores and the write-back around them are the real ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import lmdb
import pytest
import torch

import tiercache.tiers.lmdb as lmdb_tier
from tiercache.cache import CacheConfig, CacheManager
from tiercache.errors import NotFoundError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.lmdb_env import LmdbDatabases

L2, L3 = TierLevel.L2, TierLevel.L3


def payload_for(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


class FailingReadHost(HostTier):
    """A real L2 whose reads raise while ``failing`` is set (a source copy that cannot be read)."""

    failing = False

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        if type(self).failing:
            raise OSError("injected read failure")
        return super().read_into(chunk_ids, dsts)


class Cache:
    def __init__(self, tmp: Path, ns: Namespace, write: WritePolicyKind, l2_cls: type[HostTier]) -> None:
        self.ns = ns
        self.nbytes = ns.layout.chunk_bytes
        self.l2 = l2_cls(
            HostTierConfig(capacity_bytes=2 * self.nbytes, slot_bytes=self.nbytes, segment_prefix="tc-drop")
        )
        self.l3 = LmdbTier(LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=1 << 20))
        # LRU pinned: the tests pick their victims by LRU order
        config = CacheConfig(write_policy=write, eviction_policy=EvictionPolicyKind.LRU)
        self.cache = CacheManager([self.l2, self.l3], config)
        self.ns_id = self.cache.register_namespace(ns)

    def key(self, seed: int) -> bytes:
        return chunk_keys(self.ns, list(range(seed * 1000, seed * 1000 + self.ns.layout.chunk_tokens)))[0]

    def put(self, key: bytes, level: TierLevel | None = None) -> int:
        ticket = self.cache.begin_store(self.ns_id, [key], level=level)
        for slot in ticket.slots:
            slot.buffer.copy_(payload_for(key, self.nbytes))
        return self.cache.commit_store(ticket.ticket_id)

    def served(self, key: bytes) -> bool:
        """True when served with the right bytes, False on a miss; a wrong byte fails the test."""
        got = self.cache.get(self.ns_id, [key])[0]
        if got is not None:
            assert torch.equal(got, payload_for(key, self.nbytes)), "served a wrong byte"
        return got is not None

    def dropped(self, level: TierLevel) -> int:
        return self.cache.stats().tier(level).dropped_chunks


@pytest.fixture
def make(tmp_path: Path, namespace: Namespace) -> Iterator[Callable[..., Cache]]:
    made: list[Cache] = []

    def factory(
        write: WritePolicyKind = WritePolicyKind.ON_EVICT, l2_cls: type[HostTier] = HostTier
    ) -> Cache:
        c = Cache(tmp_path, namespace, write, l2_cls)
        made.append(c)
        return c

    yield factory
    FailingReadHost.failing = False
    for c in made:
        c.cache.close()


@pytest.fixture
def failing_write(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """While the returned flag is set, L3's write transaction puts the first value, then raises inside."""
    real = lmdb_tier.write_values
    on = [False]

    def write_values(
        env: lmdb.Environment,
        dbs: LmdbDatabases,
        values: Sequence[tuple[bytes, memoryview | bytes]],
        first_seq: int,
        pending: Mapping[bytes, int],
    ) -> None:
        if not on[0]:
            real(env, dbs, values, first_seq, pending)
            return
        with env.begin(write=True) as txn:
            txn.put(values[0][0], values[0][1], db=dbs.values)
            raise lmdb.DiskError("injected write failure")

    monkeypatch.setattr(lmdb_tier, "write_values", write_values)
    return on


def test_a_commit_raising_inside_the_lmdb_write_leaves_no_reservation(
    make: Callable[..., Cache], failing_write: list[bool]
) -> None:
    c = make()
    key = c.key(0)
    failing_write[0] = True
    with pytest.raises(lmdb.DiskError):
        c.put(key, level=L3)
    assert c.l3.usage().reserved_bytes == 0
    assert c.l3.usage().chunks == 0
    assert not c.served(key)
    with pytest.raises(NotFoundError):  # the failed slots left the ticket, which closed
        c.cache.commit_store(1)
    failing_write[0] = False
    assert c.put(key, level=L3) == 1  # the same chunk stores fine afterwards
    assert c.served(key)


def test_a_failed_demotion_releases_its_reservation_and_counts_the_drop(
    make: Callable[..., Cache], failing_write: list[bool]
) -> None:
    c = make()
    keys = [c.key(i) for i in range(3)]
    c.put(keys[0])
    c.put(keys[1])
    failing_write[0] = True
    assert c.put(keys[2]) == 1  # evicts keys[0]; its demotion fails, the store still lands in L2
    assert c.l3.usage().reserved_bytes == 0
    assert c.dropped(L2) == 1 and c.dropped(L3) == 0
    assert c.cache.stats().tier(L3).demotions == 0
    assert c.cache.lookup(c.ns_id, [keys[2]]).by_tier[L2] == 1
    assert [c.served(k) for k in keys] == [False, True, True]
    failing_write[0] = False
    c.put(c.key(3))  # evicts keys[1] and demotes it: nothing more is dropped
    assert c.dropped(L2) == 1
    assert [c.served(k) for k in keys] == [False, True, True]


def test_a_failed_source_read_during_demotion_releases_the_reservation(make: Callable[..., Cache]) -> None:
    c = make(l2_cls=FailingReadHost)
    keys = [c.key(i) for i in range(3)]
    c.put(keys[0])
    c.put(keys[1])
    FailingReadHost.failing = True
    assert c.put(keys[2]) == 1
    FailingReadHost.failing = False
    assert c.l3.usage().reserved_bytes == 0 and c.l3.usage().chunks == 0
    assert c.dropped(L2) == 1
    assert [c.served(k) for k in keys] == [False, True, True]


def test_a_failed_write_down_counts_a_dropped_chunk_at_the_target(
    make: Callable[..., Cache], failing_write: list[bool]
) -> None:
    c = make(write=WritePolicyKind.WRITE_THROUGH)
    key = c.key(0)
    failing_write[0] = True
    c.put(key)
    c.cache.flush()
    assert c.l3.usage().reserved_bytes == 0
    stats = c.cache.stats()
    assert stats.tier(L3).dropped_chunks == 1 and stats.tier(L2).dropped_chunks == 0
    assert stats.failed_writes == 1
    assert c.served(key)  # still served from L2

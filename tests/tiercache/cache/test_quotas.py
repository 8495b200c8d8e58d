"""Per-tenant quotas in the cache core, over real tiers (L2 in shared memory, L3 in LMDB): each limit is
refused with the limit named, a greedy tenant trims itself and never evicts another below its share, and a
tenant's stats show its own chunks only."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.cache.quotas import QuotaExceededError, QuotaTable, TenantQuota
from tiercache.errors import CapacityError, InvalidArgumentError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.tiers.base import TierLevel, WriteSlot
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L2, L3 = TierLevel.L2, TierLevel.L3
L2_SLOTS = 6


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Shared:
    """One cache shared by tenants ``a`` and ``b``, registered with the same namespace."""

    def __init__(
        self, tmp: Path, namespace: Namespace, quotas: QuotaTable | None, config: CacheConfig | None = None
    ) -> None:
        self.ns = namespace
        self.nbytes = namespace.layout.chunk_bytes
        self.clock = Clock()
        l2 = HostTier(
            HostTierConfig(
                capacity_bytes=L2_SLOTS * self.nbytes, slot_bytes=self.nbytes, segment_prefix="tiercache-test"
            )
        )
        l3 = LmdbTier(LmdbTierConfig(path=str(tmp / "l3"), capacity_bytes=40 * (HEADER_BYTES + self.nbytes)))
        self.cache = CacheManager([l2, l3], config, clock=self.clock)
        if quotas is not None:
            self.cache.set_quotas(quotas)
        self.ids = {t: self.cache.register_namespace(namespace, t) for t in ("a", "b")}

    def keys(self, n: int, seed: int) -> list[bytes]:
        return chunk_keys(self.ns, [seed * 1_000_003 + i for i in range(n * self.ns.layout.chunk_tokens)])

    def put(self, tenant: str, keys: Sequence[bytes]) -> int:
        payloads = [_payload(k, self.nbytes) for k in keys]
        stored = self.cache.put(self.ids[tenant], keys, payloads)
        self.cache.flush()
        return stored

    def in_l2(self, tenant: str, keys: Sequence[bytes]) -> int:
        return sum(self.cache.lookup(self.ids[tenant], [k]).by_tier[L2] for k in keys)


def _payload(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def shared(tmp_path: Path, namespace: Namespace) -> Iterator[type[Shared]]:
    made: list[Shared] = []

    def make(quotas: QuotaTable | None = None, config: CacheConfig | None = None) -> Shared:
        (tmp_path / f"c{len(made)}").mkdir()
        s = Shared(tmp_path / f"c{len(made)}", namespace, quotas, config)
        made.append(s)
        return s

    yield make  # type: ignore[misc]
    for s in made:
        s.cache.close()


def _slots(n: int, namespace: Namespace) -> int:
    return n * namespace.layout.chunk_bytes


def _limit(exc: pytest.ExceptionInfo[QuotaExceededError], limit: str, value: float) -> None:
    assert isinstance(exc.value, CapacityError)  # RESOURCE_EXHAUSTED on the wire
    assert (exc.value.limit, exc.value.value) == (limit, value)
    assert f"quota {limit} = " in str(exc.value)


def test_without_quotas_a_greedy_tenant_evicts_the_other(shared: type[Shared]) -> None:
    s = shared(config=CacheConfig(eviction_policy=EvictionPolicyKind.LRU))  # the greedy case needs LRU order
    a_keys = s.keys(3, seed=1)
    s.put("a", a_keys)
    for seed in range(10, 14):  # b stores 12 chunks through a 6-slot L2
        s.put("b", s.keys(3, seed=seed))
    assert s.in_l2("a", a_keys) == 0  # the baseline the share prevents


def test_a_greedy_tenant_trims_itself_and_keeps_the_others_share(
    shared: type[Shared], namespace: Namespace
) -> None:
    share = TenantQuota(l2_bytes=_slots(3, namespace))
    s = shared(QuotaTable(default=share))
    a_keys = s.keys(3, seed=1)
    assert s.put("a", a_keys) == 3
    for seed in range(10, 16):  # b stores 18 chunks: each store beyond its share evicts b's own chunks
        assert s.put("b", s.keys(3, seed=seed)) == 3
        assert s.cache.stats("b").tier(L2).used_bytes <= share.l2_bytes
    assert s.in_l2("a", a_keys) == 3
    assert s.in_l2("b", s.keys(3, seed=15)) == 3  # b's newest chunks are in L2
    assert s.cache.stats("b").tier(L2).evictions >= 15  # b's own, evicted for b
    assert s.cache.stats("a").tier(L2).evictions == 0
    for seed in range(10, 15):  # b's trimmed chunks went down to L3, not away
        assert s.cache.lookup(s.ids["b"], s.keys(3, seed=seed)).by_tier[L3] == 3


def test_more_than_the_l2_quota_at_once_is_refused(shared: type[Shared], namespace: Namespace) -> None:
    s = shared(QuotaTable(default=TenantQuota(l2_bytes=_slots(2, namespace))))
    with pytest.raises(QuotaExceededError) as exc:
        s.put("a", s.keys(3, seed=1))
    _limit(exc, "l2_bytes", _slots(2, namespace))
    assert "wanted at once" in str(exc.value) and "'a'" in str(exc.value)


def test_an_l2_quota_full_of_leased_chunks_refuses_the_store(
    shared: type[Shared], namespace: Namespace
) -> None:
    s = shared(QuotaTable(default=TenantQuota(l2_bytes=_slots(2, namespace))))
    keys = s.keys(2, seed=1)
    s.put("a", keys)
    lease = s.cache.acquire(s.ids["a"], keys, L2, wait_s=0)
    assert len(lease.chunks) == 2
    with pytest.raises(QuotaExceededError) as exc:
        s.put("a", s.keys(1, seed=2))
    _limit(exc, "l2_bytes", _slots(2, namespace))
    s.cache.release(lease.lease_id)
    assert s.put("a", s.keys(1, seed=2)) == 1  # now one of its own can go


def test_a_promotion_counts_against_the_promoting_tenants_quota(
    shared: type[Shared], namespace: Namespace
) -> None:
    """A load that promotes from L3 trims the tenant's own L2 chunks first and stops at its quota: its lease
    cannot take the free space another tenant's share needs (see tiercache.cache.borrowing)."""
    share = TenantQuota(l2_bytes=_slots(3, namespace))
    s = shared(QuotaTable(default=share))
    a_keys = s.keys(3, seed=1)
    assert s.put("a", a_keys[:1]) == 1
    b_keys = [k for seed in range(10, 13) for k in s.keys(3, seed=seed)]
    for i in range(0, 9, 3):  # b: 3 chunks in L2, 6 trimmed down to L3
        assert s.put("b", b_keys[i : i + 3]) == 3
    lease = s.cache.acquire(s.ids["b"], b_keys[:6], L2)  # promotes from L3, as long as it takes
    assert len(lease.chunks) == 3  # its share, its other L2 chunks trimmed for it (the old code: 5)
    assert s.cache.stats("b").tier(L2).used_bytes <= share.l2_bytes
    assert s.put("a", a_keys[1:]) == 2  # a, within its share, finds its room
    assert s.in_l2("a", a_keys) == 3 and s.cache.stats("a").tier(L2).evictions == 0
    s.cache.release(lease.lease_id)


def test_the_l3_quota_trims_the_tenants_own_l3_chunks(shared: type[Shared], namespace: Namespace) -> None:
    cap = 4 * (HEADER_BYTES + namespace.layout.chunk_bytes)
    s = shared(QuotaTable(default=TenantQuota(l3_bytes=cap)))
    b_keys = s.keys(4, seed=50)
    s.put("b", b_keys)
    for seed in range(1, 5):
        s.put("a", s.keys(2, seed=seed))
        assert s.cache.stats("a").tier(L3).used_bytes <= cap
    assert s.cache.lookup(s.ids["b"], b_keys).by_tier[L3] == 4


def test_a_commit_does_not_trim_the_copies_its_own_write_downs_just_made(
    shared: type[Shared], namespace: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trim after a commit counts what the tenant holds in L3 and what the commit's write-downs will
    still bring there; a write-down that lands in between must not count twice (it once evicted all of
    b's new L3 copies when the write-back worker ran right after the count: a flaky CI failure)."""
    cap = 4 * (HEADER_BYTES + namespace.layout.chunk_bytes)
    s = shared(QuotaTable(default=TenantQuota(l3_bytes=cap)))
    tenants = s.cache._tenants
    gate = threading.Event()
    s.cache._writeback._executor.submit(gate.wait)  # the worker is busy: b's write-downs queue behind
    trim_tier = tenants.trim_tier
    calls = []

    def trim_tier_after_the_write_downs(*args: object) -> None:
        calls.append(args)
        if len(calls) == 2:  # the commit's trim (the first is the store's own, before it)
            gate.set()
            assert s.cache._writeback.settle(30.0)  # the worker writes b's chunks down now
        trim_tier(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(tenants, "trim_tier", trim_tier_after_the_write_downs)
    keys = s.keys(4, seed=50)
    assert s.put("b", keys) == 4
    assert len(calls) == 2
    assert s.cache.lookup(s.ids["b"], keys).by_tier[L3] == 4
    assert s.cache.stats("b").tier(L3).evictions == 0


def test_leases_quota(shared: type[Shared]) -> None:
    s = shared(QuotaTable(default=TenantQuota(leases=1)))
    keys = s.keys(2, seed=1)
    s.put("a", keys)
    first = s.cache.acquire(s.ids["a"], keys, L2, wait_s=0)
    assert first.lease_id
    with pytest.raises(QuotaExceededError) as exc:
        s.cache.acquire(s.ids["a"], keys, L2, wait_s=0)
    _limit(exc, "leases", 1)
    s.put("b", keys)
    assert s.cache.acquire(s.ids["b"], keys, L2, wait_s=0).lease_id  # b's own count
    s.cache.release(first.lease_id)
    assert s.cache.acquire(s.ids["a"], keys, L2, wait_s=0).lease_id


def test_tickets_quota_and_an_expired_ticket_frees_its_place(shared: type[Shared]) -> None:
    s = shared(QuotaTable(default=TenantQuota(tickets=1)))
    first = s.cache.begin_store(s.ids["a"], s.keys(1, seed=1), ttl_s=5)
    with pytest.raises(QuotaExceededError) as exc:
        s.cache.begin_store(s.ids["a"], s.keys(1, seed=2))
    _limit(exc, "tickets", 1)
    s.clock.now += 6  # the first ticket lapses
    s.cache.stats()  # reaps it
    second = s.cache.begin_store(s.ids["a"], s.keys(1, seed=2))
    assert second.ticket_id != first.ticket_id
    assert s.cache.abort_store(second.ticket_id)


def test_lifetime_cap(shared: type[Shared]) -> None:
    s = shared(QuotaTable(default=TenantQuota(max_ttl_s=5.0)))
    keys = s.keys(1, seed=1)
    with pytest.raises(QuotaExceededError) as exc:
        s.cache.begin_store(s.ids["a"], keys, ttl_s=10)
    _limit(exc, "max_ttl_s", 5.0)
    ticket = s.cache.begin_store(s.ids["a"], keys)  # the default (30 s) is shortened to the cap
    assert ticket.expires_at == pytest.approx(s.clock.now + 5.0)
    s.cache.commit_store(ticket.ticket_id)
    with pytest.raises(QuotaExceededError):
        s.cache.acquire(s.ids["a"], keys, L2, ttl_s=6, wait_s=0)
    with pytest.raises(QuotaExceededError):
        s.cache.claim_prefill(s.ids["a"], s.keys(1, seed=2), ttl_s=6)
    assert s.cache.acquire(s.ids["a"], keys, L2, wait_s=0).expires_at == pytest.approx(s.clock.now + 5.0)


def test_pinned_bytes_quota(shared: type[Shared], namespace: Namespace) -> None:
    s = shared(QuotaTable(default=TenantQuota(pinned_bytes=_slots(2, namespace))))
    keys = s.keys(3, seed=1)
    s.put("a", keys)
    assert s.cache.pin(s.ids["a"], keys[:2]) == 2
    assert s.cache.pin(s.ids["a"], keys[:2]) == 0  # pinned already: costs nothing more
    with pytest.raises(QuotaExceededError) as exc:
        s.cache.pin(s.ids["a"], keys[2:])
    _limit(exc, "pinned_bytes", _slots(2, namespace))
    with pytest.raises(QuotaExceededError):
        s.cache.pin(s.ids["a"])  # the whole namespace
    s.cache.unpin(s.ids["a"], keys[:1])
    assert s.cache.pin(s.ids["a"], keys[2:]) == 1


def test_stores_into_a_pinned_namespace_count_as_pinned(shared: type[Shared], namespace: Namespace) -> None:
    s = shared(QuotaTable(default=TenantQuota(pinned_bytes=_slots(2, namespace))))
    s.put("a", s.keys(1, seed=1))
    s.cache.pin(s.ids["a"])
    assert s.put("a", s.keys(1, seed=2)) == 1
    with pytest.raises(QuotaExceededError) as exc:
        s.put("a", s.keys(1, seed=3))
    _limit(exc, "pinned_bytes", _slots(2, namespace))


def test_a_tenants_stats_show_its_own_chunks_only(shared: type[Shared], namespace: Namespace) -> None:
    s = shared(QuotaTable(default=TenantQuota(l2_bytes=_slots(3, namespace))))
    s.put("a", s.keys(2, seed=1))
    s.put("b", s.keys(3, seed=2))
    s.cache.lookup(s.ids["b"], s.keys(3, seed=2), count=True)
    lease = s.cache.acquire(s.ids["b"], s.keys(3, seed=2), L2, wait_s=0)
    full, a, b = s.cache.stats(), s.cache.stats("a"), s.cache.stats("b")
    assert full.tier(L2).chunks == 5
    assert (a.tier(L2).chunks, b.tier(L2).chunks) == (2, 3)
    assert a.tier(L2).used_bytes == _slots(2, namespace)
    assert a.tier(L2).capacity_bytes == _slots(3, namespace)  # its quota, not the tier
    assert a.tier(L2).payload_bytes == 2 * namespace.layout.chunk_bytes
    assert a.tier(L2).utilisation == pytest.approx(2 / 3)  # of its quota
    assert b.tier(L3).payload_bytes == 3 * namespace.layout.chunk_bytes  # written through
    assert b.tier(L3).utilisation == pytest.approx(b.tier(L3).payload_bytes / full.tier(L3).capacity_bytes)
    assert (a.namespaces, b.namespaces, full.namespaces) == (1, 1, 2)
    assert (a.active_leases, b.active_leases) == (0, 1)
    assert a.tier(L2).lookup_hit_tokens == 0
    assert b.tier(L2).lookup_hit_tokens == 3 * namespace.layout.chunk_tokens
    assert (a.tier(L2).hits, b.tier(L2).hits) == (0, 3)
    s.cache.release(lease.lease_id)
    assert s.cache.tenants() == ["a", "b"]


def test_quota_values_are_checked() -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        TenantQuota(leases=-1)
    assert exc.value.field == "leases"
    with pytest.raises(InvalidArgumentError) as exc:
        TenantQuota(max_ttl_s=float("nan"))
    assert exc.value.field == "max_ttl_s"
    assert not QuotaTable().active and QuotaTable(default=TenantQuota(rpc_rate=1)).active


def test_concurrent_acquires_never_overrun_the_leases_quota(shared: type[Shared]) -> None:
    s = shared(QuotaTable(default=TenantQuota(leases=2)))
    keys = s.keys(2, seed=1)
    s.put("a", keys)
    start = threading.Barrier(8)
    granted: list[int] = []
    refused: list[str] = []

    def acquire() -> None:
        start.wait()
        try:
            granted.append(s.cache.acquire(s.ids["a"], keys, L2, wait_s=0).lease_id)
        except QuotaExceededError as exc:
            refused.append(exc.limit)

    threads = [threading.Thread(target=acquire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 2 and all(granted)
    assert refused == ["leases"] * 6
    assert s.cache.stats("a").active_leases == 2


class GatedLmdbTier(LmdbTier):
    """A real L3 whose commits wait for ``gate``: a write-down into it stays in flight (holding the chunk it
    copies) until the test opens the gate; ``entered`` is set once one is waiting."""

    def __init__(self, config: LmdbTierConfig, gate: threading.Event) -> None:
        super().__init__(config)
        self.gate = gate
        self.entered = threading.Event()

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        super().commit(slots)


def _gated(tmp_path: Path, namespace: Namespace) -> tuple[CacheManager, bytes, GatedLmdbTier]:
    """A cache whose tenant ``a`` may hold one chunk in L2, over a gated L3."""
    nbytes = namespace.layout.chunk_bytes
    l2 = HostTier(
        HostTierConfig(capacity_bytes=L2_SLOTS * nbytes, slot_bytes=nbytes, segment_prefix="tiercache-test")
    )
    l3 = GatedLmdbTier(
        LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=40 * (HEADER_BYTES + nbytes)),
        threading.Event(),
    )
    # write-through: a store's write-down is queued at its commit
    cache = CacheManager([l2, l3], CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH))
    cache.set_quotas(QuotaTable(default=TenantQuota(l2_bytes=_slots(1, namespace))))
    return cache, cache.register_namespace(namespace, "a"), l3


def _one_chunk(namespace: Namespace, seed: int) -> list[bytes]:
    return chunk_keys(namespace, [seed * 1_000_003 + i for i in range(namespace.layout.chunk_tokens)])


def _put(cache: CacheManager, ns_id: bytes, namespace: Namespace, seed: int) -> int:
    """Store one chunk of tenant ``a`` (no flush: its write-down to L3 is queued)."""
    keys = _one_chunk(namespace, seed)
    return cache.put(ns_id, keys, [_payload(k, namespace.layout.chunk_bytes) for k in keys])


def test_a_store_at_its_quota_waits_for_the_write_down_holding_its_chunk(
    tmp_path: Path, namespace: Namespace
) -> None:
    cache, ns_id, l3 = _gated(tmp_path, namespace)
    try:
        assert _put(cache, ns_id, namespace, seed=1) == 1  # its whole share
        assert l3.entered.wait(30)  # the chunk's write-down holds it, waiting at the gate
        opener = threading.Timer(0.2, l3.gate.set)
        opener.start()
        assert _put(cache, ns_id, namespace, seed=2) == 1  # waited for it, then trimmed it from L2
        opener.join()
        cache.flush()
        assert cache.stats("a").tier(L2).used_bytes == _slots(1, namespace)
        assert cache.lookup(ns_id, _one_chunk(namespace, seed=1)).by_tier[L3] == 1  # went down, not away
    finally:
        l3.gate.set()
        cache.close()


def test_a_store_at_its_quota_behind_a_write_down_that_never_finishes_is_refused(
    tmp_path: Path, namespace: Namespace
) -> None:
    cache, ns_id, l3 = _gated(tmp_path, namespace)
    try:
        assert _put(cache, ns_id, namespace, seed=1) == 1
        assert l3.entered.wait(30)
        with pytest.raises(QuotaExceededError) as exc:  # after waiting WRITE_DOWN_WAIT_S for it
            _put(cache, ns_id, namespace, seed=2)
        _limit(exc, "l2_bytes", _slots(1, namespace))
        assert "none of its own chunks" in str(exc.value)
    finally:
        l3.gate.set()
        cache.close()

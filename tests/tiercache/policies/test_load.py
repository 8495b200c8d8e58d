"""Load policies: decisions, rate estimates, deadlines under a slow L3, prefetch coalescing and bounds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.policies.load import (
    BestEffort,
    CostAware,
    CostPlan,
    DeadlineModel,
    LoadChoice,
    LoadPolicy,
    LoadPolicyKind,
    PrefillModel,
    Timeout,
    WaitComplete,
    make_load_policy,
    plan_cost_aware,
)
from tiercache.rates import RateEstimator, TierRate
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

L2, L3 = TierLevel.L2, TierLevel.L3


# ---------------------------------------------------------------- pure decisions


def test_prefill_and_deadline_models() -> None:
    m = PrefillModel(tokens_per_s=1000.0, quadratic_s=1e-6)
    assert m.seconds(0, 1000) == pytest.approx(1.0 + 1.0)
    assert m.seconds(1000, 2000) == pytest.approx(1.0 + 3.0)  # attention over the longer context costs more
    d = DeadlineModel(base_s=0.05, per_1k_tokens_s=0.01, cap_s=0.2)
    assert d.deadline_s(2000) == pytest.approx(0.07)
    assert d.deadline_s(100_000) == pytest.approx(0.2)


def test_load_policies_validate_and_resolve_their_wait() -> None:
    assert WaitComplete().wait_s(4096) is None
    assert BestEffort().wait_s(4096) == 0.0
    assert Timeout(timeout_s=0.3).wait_s(4096) == 0.3
    derived = Timeout(deadline=DeadlineModel(0.1, 0.05, 1.0))
    assert derived.wait_s(4000) == pytest.approx(0.3)
    # A timeout or cost-aware policy without a model of its own or a declared one names what it lacks.
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        Timeout().resolve()
    with pytest.raises(InvalidArgumentError, match="prefill"):
        CostAware().resolve()
    with pytest.raises(InvalidArgumentError, match="tokens_per_s"):
        PrefillModel(tokens_per_s=0)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        Timeout(-1.0)
    with pytest.raises(InvalidArgumentError, match="deadline"):
        Timeout(deadline=0.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="prefill"):
        CostAware(prefill=100.0)  # type: ignore[arg-type]


def test_open_policies_take_the_declared_models() -> None:
    declared_deadline = DeadlineModel(0.1, 0.05, 1.0)
    declared_prefill = PrefillModel(tokens_per_s=500.0)
    resolved = Timeout().resolve(declared_deadline, declared_prefill)
    assert resolved == Timeout(deadline=declared_deadline)
    assert resolved.wait_s(4000) == pytest.approx(0.3)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        Timeout().wait_s(4000)  # open: only the declared model can say how long
    # A policy's own parameters win over the declared ones.
    own = Timeout(timeout_s=0.2)
    assert own.resolve(declared_deadline).wait_s(4000) == 0.2
    assert CostAware().resolve(prefill=declared_prefill) == CostAware(declared_prefill)
    mine = CostAware(PrefillModel(tokens_per_s=1.0))
    assert mine.resolve(prefill=declared_prefill) is mine
    for policy in (WaitComplete(), BestEffort()):
        assert policy.resolve(declared_deadline, declared_prefill) is policy


def test_each_policy_chooses_its_prefix() -> None:
    keys = [b"k0", b"k1", b"k2", b"k3"]
    planned: list[tuple[list[bytes], PrefillModel]] = []

    def plan(ks: Sequence[bytes], prefill: PrefillModel) -> CostPlan:
        planned.append((list(ks), prefill))
        return CostPlan(chunks=3, load_s=0.01, recompute_s=0.5)

    for policy in (WaitComplete(), BestEffort(), Timeout(0.1)):
        assert policy.choose(keys, plan) == LoadChoice(tuple(keys))
    assert planned == []  # only cost_aware plans
    model = PrefillModel(tokens_per_s=100.0)
    choice = CostAware(model).choose(keys, plan)
    assert choice == LoadChoice((b"k0", b"k1", b"k2"), CostPlan(3, 0.01, 0.5))
    assert planned == [(keys, model)]
    assert CostAware(model).wait_s(4096) is None  # the chosen prefix is worth waiting for
    with pytest.raises(InvalidArgumentError, match="prefill"):
        CostAware().choose(keys, plan)


def test_the_registry_builds_each_policy_by_kind_or_name() -> None:
    model = PrefillModel(tokens_per_s=100.0)
    deadline = DeadlineModel(0.1)
    built = {kind: make_load_policy(kind, timeout_s=0.25, prefill=model) for kind in LoadPolicyKind}
    assert built == {
        LoadPolicyKind.WAIT_COMPLETE: WaitComplete(),
        LoadPolicyKind.BEST_EFFORT: BestEffort(),
        LoadPolicyKind.TIMEOUT: Timeout(0.25),
        LoadPolicyKind.COST_AWARE: CostAware(model),
    }
    assert all(policy.kind is kind for kind, policy in built.items())
    assert make_load_policy("timeout", deadline=deadline) == Timeout(deadline=deadline)
    assert make_load_policy("best_effort") == BestEffort()
    assert make_load_policy(LoadPolicyKind.TIMEOUT) == Timeout()  # open: the declared deadline decides
    assert isinstance(make_load_policy("cost_aware"), LoadPolicy)
    with pytest.raises(InvalidArgumentError, match="load_policy") as info:
        make_load_policy("fastest")
    assert "wait_complete, best_effort, timeout, cost_aware" in str(info.value)


def test_the_constructors_build_the_family() -> None:
    model = PrefillModel(tokens_per_s=100.0)
    assert LoadPolicy.wait_complete() == WaitComplete()
    assert LoadPolicy.best_effort() == BestEffort()
    assert LoadPolicy.timeout(0.5) == Timeout(0.5) != Timeout(0.6)
    assert LoadPolicy.timeout() == Timeout() and Timeout().open and not Timeout(0.5).open
    assert LoadPolicy.cost_aware(model) == CostAware(model)


def test_cost_aware_picks_the_prefix_with_the_largest_saving() -> None:
    cost = {L2: 0.001, L3: 0.05}
    fast_engine = PrefillModel(tokens_per_s=20_000)  # a 256-token chunk recomputes in 12.8 ms
    plan = plan_cost_aware([L2, L2, L3, L3], 256, cost.__getitem__, fast_engine)
    assert plan.chunks == 2  # L3 chunks cost 50 ms each: recompute them
    assert plan.load_s == pytest.approx(0.002) and plan.recompute_s == pytest.approx(512 / 20_000)
    assert plan_cost_aware([L3, L3], 256, cost.__getitem__, fast_engine).chunks == 0
    slow_engine = PrefillModel(tokens_per_s=1_000)
    assert plan_cost_aware([L2, L2, L3, L3], 256, cost.__getitem__, slow_engine).chunks == 4
    # Quadratic attention makes later chunks dearer to recompute: a slow tier at the end pays off.
    quad = PrefillModel(tokens_per_s=20_000, quadratic_s=1e-6)
    assert plan_cost_aware([L2, L3], 256, cost.__getitem__, quad).chunks == 2


def test_rate_estimator_recovers_latency_and_bandwidth() -> None:
    est = RateEstimator()
    assert est.rate(L3).samples == 0  # the prior
    for nbytes in (1 << 20, 4 << 20, 1 << 20, 8 << 20, 2 << 20) * 4:
        est.observe(L3, nbytes, 0.002 + nbytes / 500e6)
    rate = est.rate(L3)
    assert rate.latency_s == pytest.approx(0.002, rel=1e-3)
    assert rate.bytes_per_s == pytest.approx(500e6, rel=1e-3)
    one_size = RateEstimator({L2: TierRate(0.0, 1e9, 0)})
    for _ in range(5):
        one_size.observe(L2, 1 << 20, (1 << 20) / 4e9)
    assert one_size.rate(L2).bytes_per_s == pytest.approx(4e9)


# ---------------------------------------------------------------- against real tiers


class CountingLmdbTier(LmdbTier):
    """A real LMDB tier that counts its reads and the most reads ever in flight at once."""

    def __init__(self, config: LmdbTierConfig) -> None:
        super().__init__(config)
        self.reads = 0
        self.inflight = 0
        self.max_inflight = 0
        self._count_lock = threading.Lock()

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        with self._count_lock:
            self.reads += len(chunk_ids)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            return super().read_into(chunk_ids, dsts)
        finally:
            with self._count_lock:
                self.inflight -= 1


class Setup:
    def __init__(self, tmp: Path, namespace: Namespace, delay_s: float, **config: object) -> None:
        n = namespace.layout.chunk_bytes
        self.l3 = CountingLmdbTier(
            LmdbTierConfig(
                path=str(tmp / "l3"), capacity_bytes=64 * (n + HEADER_BYTES), fault_read_delay_s=delay_s
            )
        )
        l2 = HostTier(HostTierConfig(capacity_bytes=32 * n, slot_bytes=n, segment_prefix="tiercache-test-ld"))
        self.cache = CacheManager(
            [l2, self.l3],
            CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH, **config),  # type: ignore[arg-type]
        )
        self.ns = self.cache.register_namespace(namespace)
        tokens = list(range(8 * namespace.layout.chunk_tokens))
        self.keys = chunk_keys(namespace, tokens)
        gen = torch.Generator().manual_seed(7)
        self.payloads = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) for _ in self.keys]

    def cold(self, count: int) -> list[bytes]:
        """Store ``count`` chunks and leave them only in L3."""
        keys = self.keys[:count]
        self.cache.put(self.ns, keys, self.payloads[:count])
        self.cache.flush()
        self.cache.demote(self.ns, keys, L3)
        self.l3.reads = 0
        return keys


@pytest.fixture
def setup(tmp_path: Path, namespace: Namespace, request: pytest.FixtureRequest) -> Iterator[Setup]:
    params = getattr(request, "param", {})
    s = Setup(tmp_path, namespace, **{"delay_s": 0.0, **params})
    yield s
    s.cache.close()


@pytest.mark.parametrize("setup", [{"delay_s": 2.0}], indirect=True)
def test_timeout_returns_at_the_deadline_while_l3_is_slow(setup: Setup) -> None:
    keys = setup.cold(3)
    start = time.monotonic()
    ticket = setup.cache.acquire(setup.ns, keys, level=L2, wait_s=0.2)
    elapsed = time.monotonic() - start
    assert ticket.chunks == () and ticket.lease_id == 0  # nothing arrived in time: recompute everything
    assert elapsed < 1.5, f"a 0.2 s deadline took {elapsed:.2f} s; one slow read alone takes 2 s"
    # The promotion goes on in the background: a later load finds the chunk ready.
    again = setup.cache.acquire(setup.ns, keys[:1], level=L2, wait_s=10)
    assert len(again.chunks) == 1 and torch.equal(again.chunks[0].view, setup.payloads[0])
    assert again.chunks[0].source == L3
    setup.cache.release(again.lease_id)


def test_best_effort_takes_only_what_is_ready(setup: Setup) -> None:
    keys = setup.cold(3)
    setup.cache.promote(setup.ns, keys[:1], L2)
    ticket = setup.cache.acquire(setup.ns, keys, level=L2, wait_s=0)
    assert [c.index for c in ticket.chunks] == [0] and setup.l3.reads == 1  # the one promote, nothing more
    setup.cache.release(ticket.lease_id)
    full = setup.cache.acquire(setup.ns, keys, level=L2)  # wait_complete
    assert len(full.chunks) == 3
    for ch in full.chunks:
        assert torch.equal(ch.view, setup.payloads[ch.index])
    setup.cache.release(full.lease_id)


@pytest.mark.parametrize("setup", [{"delay_s": 0.3}], indirect=True)
def test_prefetches_of_the_same_chunks_coalesce(setup: Setup) -> None:
    keys = setup.cold(4)
    first = setup.cache.prefetch(setup.ns, keys, L2)
    second = setup.cache.prefetch(setup.ns, keys, L2)
    assert all(f.result(timeout=30) for f in first.futures + second.futures)
    assert setup.l3.reads == 4  # one read per chunk, not two
    assert first.ready() == second.ready() == 4
    assert setup.cache.stats().single_flight_joins >= 1


@pytest.mark.parametrize("setup", [{"delay_s": 0.3, "prefetch_workers": 1}], indirect=True)
def test_a_cancelled_prefetch_stops_reading(setup: Setup) -> None:
    keys = setup.cold(6)
    pf = setup.cache.prefetch(setup.ns, keys, L2)
    assert pf.cancel() >= 4  # one worker: at most the first promotions had started
    for f in pf.futures:
        if not f.cancelled():
            f.result(timeout=30)
    assert setup.l3.reads <= 2


@pytest.mark.parametrize(
    "setup", [{"delay_s": 0.1, "prefetch_workers": 4, "prefetch_inflight_bytes": 1}], indirect=True
)
def test_prefetch_bytes_in_flight_are_bounded(setup: Setup) -> None:
    keys = setup.cold(6)
    pf = setup.cache.prefetch(setup.ns, keys, L2)
    assert all(f.result(timeout=60) for f in pf.futures)
    assert setup.l3.reads == 6 and setup.l3.max_inflight == 1  # the budget holds one chunk at a time


@pytest.mark.parametrize("setup", [{"delay_s": 0.05}], indirect=True)
def test_cost_aware_recomputes_when_the_tier_is_too_slow(setup: Setup, namespace: Namespace) -> None:
    keys = setup.cold(4)
    setup.cache.promote(setup.ns, keys[:2], L2)  # measures L3 (50 ms per read) on the way
    assert setup.cache.rates()[L3].samples >= 2
    tokens = namespace.layout.chunk_tokens
    fast = PrefillModel(tokens_per_s=tokens / 0.01)  # recomputing a chunk takes 10 ms: L3 loses
    plan = setup.cache.plan_load(setup.ns, keys, fast, L2)
    assert plan.chunks == 2  # the two chunks already in L2 are worth it, the L3 ones are not
    slow = PrefillModel(tokens_per_s=tokens / 1.0)  # 1 s per chunk: even slow L3 wins
    assert setup.cache.plan_load(setup.ns, keys, slow, L2).chunks == 4


def test_token_weighted_counters(setup: Setup, namespace: Namespace) -> None:
    keys = setup.cold(3)
    setup.cache.promote(setup.ns, keys[:1], L2)
    tokens = namespace.layout.chunk_tokens
    assert setup.cache.lookup(setup.ns, keys + setup.keys[5:6], count=True).chunks == 3
    ticket = setup.cache.acquire(setup.ns, keys[:2], level=L2)
    setup.cache.release(ticket.lease_id)
    unused = setup.cache.stats()  # a lease released without a report of its copy counts nothing loaded
    assert (unused.tier(L2).load_success_tokens, unused.tier(L3).load_success_tokens) == (0, 0)
    both = {L2: tokens, L3: tokens}
    setup.cache.report_usage(setup.ns, both, 2 * tokens, both)
    stats = setup.cache.stats()
    assert (stats.tier(L2).lookup_hit_tokens, stats.tier(L3).lookup_hit_tokens) == (tokens, 2 * tokens)
    assert (stats.tier(L2).load_success_tokens, stats.tier(L3).load_success_tokens) == (tokens, tokens)
    assert (stats.tier(L2).effective_hit_tokens, stats.tier(L3).effective_hit_tokens) == (tokens, tokens)
    assert stats.recomputed_tokens == 2 * tokens
    with pytest.raises(InvalidArgumentError, match="recomputed_tokens"):
        setup.cache.report_usage(setup.ns, {}, -1, {})
    with pytest.raises(InvalidArgumentError, match="loaded_by_tier"):
        setup.cache.report_usage(setup.ns, {}, 0, {L2: -1})

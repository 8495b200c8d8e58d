"""Load policies, prefetch cancellation and coalescing, single-flight prefill, usage reports and the new
stats, through a real daemon process and the generated stubs.

Daemons with a slow L3 (the product's fault injection: ``--l3-fault-read-delay-s`` /
``--l3-fault-read-bytes-per-s``) are prepared once per scenario: chains are stored, written down to L3, and the
daemon is restarted on the same L3 so that the chains are only there. The only wall-clock assertions are the
deadline-adherence ones, with a generous bound (a 0.2 s deadline against 2 s reads).
"""

from __future__ import annotations

import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.daemon.conftest import (
    NAMESPACE,
    RPC_TIMEOUT_S,
    DaemonProc,
    make_keys,
    namespace_spec,
    new_daemon,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.testing.waits import wait_until

WAIT_S = 30.0
CHUNK_TOKENS = NAMESPACE.layout.chunk_tokens


def _stats(stub: pb_grpc.KVCacheServiceStub) -> pb.StatsResponse:
    reply: pb.StatsResponse = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    return reply


def _tier(stats: pb.StatsResponse, tier: int) -> pb.TierStats:
    return next(t for t in stats.tiers if t.tier == tier)


def _register(
    stub: pb_grpc.KVCacheServiceStub,
    prefill: pb.PrefillModel | None = None,
    deadline: pb.DeadlineModel | None = None,
    salt: str = "",
) -> pb.RegisterResponse:
    spec = namespace_spec()
    spec.cache_salt = salt
    req = pb.RegisterRequest(namespace=spec, engine_id="policy-test", prefill=prefill, deadline=deadline)
    reply: pb.RegisterResponse = stub.Register(req, timeout=RPC_TIMEOUT_S)
    return reply


def _acquire(
    stub: pb_grpc.KVCacheServiceStub,
    handle: bytes,
    keys: Sequence[bytes],
    policy: int,
    timeout_s: float = 0.0,
) -> pb.AcquireLoadResponse:
    req = pb.AcquireLoadRequest(handle=handle, keys=keys, policy=policy, timeout_s=timeout_s)
    reply: pb.AcquireLoadResponse = stub.AcquireLoad(req, timeout=RPC_TIMEOUT_S + 10)
    return reply


def _release(stub: pb_grpc.KVCacheServiceStub, handle: bytes, lease_id: int) -> None:
    if lease_id:
        stub.ReleaseLoad(pb.ReleaseLoadRequest(handle=handle, lease_id=lease_id), timeout=RPC_TIMEOUT_S)


@dataclass
class ColdL3:
    """A daemon whose chains (by seed) are only in L3."""

    daemon: DaemonProc
    chains: dict[int, list[bytes]]

    def stub(self) -> pb_grpc.KVCacheServiceStub:
        return self.daemon.stub()


def _cold_l3(tmp: Path, fault: Sequence[str], chains: dict[int, int]) -> Iterator[ColdL3]:
    """Store ``chains`` (seed -> chunks), let them reach L3, restart the daemon with ``fault`` on that L3."""
    prefix = f"tiercache-test-{secrets.token_hex(4)}"  # xdist workers share /dev/shm and tmp names
    # write-through: the stores reach L3 at once
    first = new_daemon(tmp, ["--write-policy", "write_through"], prefix=prefix).start()
    keys = {seed: make_keys(n, seed) for seed, n in chains.items()}
    try:
        stub = first.stub()
        reg = register(stub)
        for seed, ks in keys.items():
            assert shm_store(stub, reg, ks, [payload(i, seed) for i in range(len(ks))]) == len(ks)
        total = sum(chains.values())
        wait_until(lambda: _tier(_stats(stub), pb.TIER_L3).chunks == total, WAIT_S, "write-down to L3")
        assert first.terminate() == 0
    finally:
        first.cleanup()
    second = new_daemon(tmp, fault, prefix).start()
    try:
        yield ColdL3(second, keys)
    finally:
        second.cleanup()


@pytest.fixture(scope="module")
def slow_reads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ColdL3]:
    """Every L3 read takes 2 s more."""
    yield from _cold_l3(
        tmp_path_factory.mktemp("slow-reads"), ["--l3-fault-read-delay-s", "2"], {1: 2, 2: 1, 3: 1}
    )


@pytest.fixture(scope="module")
def throttled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ColdL3]:
    """L3 reads at 64 KiB/s: a 32 KiB chunk takes 0.5 s."""
    yield from _cold_l3(
        tmp_path_factory.mktemp("throttled"), ["--l3-fault-read-bytes-per-s", "64K"], {10: 1, 11: 2}
    )


@pytest.fixture(scope="module")
def half_second_reads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ColdL3]:
    """Every L3 read takes 0.5 s more."""
    yield from _cold_l3(
        tmp_path_factory.mktemp("half-second"),
        ["--l3-fault-read-delay-s", "0.5"],
        {20: 8, 21: 8, 22: 3},
    )


# ---------------------------------------------------------------------------------------- registration


@pytest.mark.parametrize(
    ("prefill", "deadline", "field"),
    [
        (pb.PrefillModel(tokens_per_s=0), None, "prefill.tokens_per_s"),
        (pb.PrefillModel(tokens_per_s=100, quadratic_s=-1), None, "prefill.quadratic_s"),
        (None, pb.DeadlineModel(base_s=-0.5), "deadline.base_s"),
        (None, pb.DeadlineModel(base_s=0.1, cap_s=float("nan")), "deadline.cap_s"),
    ],
)
def test_register_rejects_bad_models(
    shared_daemon: DaemonProc,
    prefill: pb.PrefillModel | None,
    deadline: pb.DeadlineModel | None,
    field: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _register(shared_daemon.stub(), prefill, deadline)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (info.value.details() or "")


def test_policies_that_need_a_model_say_which(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = _register(stub, salt="no-models")
    keys = make_keys(1, seed=301)
    for policy, field in ((pb.LOAD_POLICY_TIMEOUT, "timeout_s"), (pb.LOAD_POLICY_COST_AWARE, "prefill")):
        with pytest.raises(grpc.RpcError) as info:
            _acquire(stub, reg.handle, keys, policy)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        _acquire(stub, reg.handle, keys, 42)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "policy" in (info.value.details() or "")


# ---------------------------------------------------------------------------------------- deadlines


def test_deadlines_are_honoured_while_l3_reads_take_2s(slow_reads: ColdL3) -> None:
    stub = slow_reads.stub()
    reg = _register(stub)
    keys, other = slow_reads.chains[1], slow_reads.chains[2]

    best = _acquire(stub, reg.handle, keys, pb.LOAD_POLICY_BEST_EFFORT)
    assert (best.lease_id, len(best.slots), best.cached) == (0, 0, 2)

    started = time.monotonic()
    timed = _acquire(stub, reg.handle, keys, pb.LOAD_POLICY_TIMEOUT, timeout_s=0.2)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"a 0.2 s deadline took {elapsed:.2f}s"
    assert (len(timed.slots), timed.cached) == (0, 2)

    # The deadline model declared at registration stands in for timeout_s.
    reg = _register(stub, deadline=pb.DeadlineModel(base_s=0.2, per_1k_tokens_s=0.0, cap_s=1.0))
    started = time.monotonic()
    modelled = _acquire(stub, reg.handle, other, pb.LOAD_POLICY_TIMEOUT)
    assert time.monotonic() - started < 1.5
    assert (len(modelled.slots), modelled.cached) == (0, 1)

    # Promotions started by the timed-out loads went on in the background: the chain arrives in L2.
    wait_until(lambda: len(_held(stub, reg.handle, keys)) == 2, WAIT_S, "background promotion")

    # wait_complete waits for the slow read and says where the chunk came from.
    full = _acquire(stub, reg.handle, slow_reads.chains[3], pb.LOAD_POLICY_WAIT_COMPLETE)
    assert [(s.index, s.source) for s in full.slots] == [(0, pb.TIER_L3)]
    _release(stub, reg.handle, full.lease_id)
    l3 = _tier(_stats(stub), pb.TIER_L3)
    assert l3.load_success_tokens == 0  # counted only from the engine's report of its copy
    assert 0 < l3.bytes_per_s < 1e6  # the measured rate includes the injected delay


def _held(stub: pb_grpc.KVCacheServiceStub, handle: bytes, keys: Sequence[bytes]) -> list[pb.SlotRef]:
    """The slots a best-effort load gets now (released at once)."""
    reply = _acquire(stub, handle, keys, pb.LOAD_POLICY_BEST_EFFORT)
    _release(stub, handle, reply.lease_id)
    return list(reply.slots)


# ---------------------------------------------------------------------------------------- cost-aware


def test_cost_aware_recomputes_when_l3_is_too_slow_and_loads_when_prefill_is_slower(
    throttled: ColdL3,
) -> None:
    stub = throttled.stub()
    warm, keys = throttled.chains[10], throttled.chains[11]
    reg = _register(stub)
    # One read teaches the daemon how slow L3 is (0.5 s for a 32 KiB chunk).
    _release(stub, reg.handle, _acquire(stub, reg.handle, warm, pb.LOAD_POLICY_WAIT_COMPLETE).lease_id)
    assert _tier(_stats(stub), pb.TIER_L3).bytes_per_s < 1e6

    fast = _register(stub, prefill=pb.PrefillModel(tokens_per_s=1600))  # a chunk in 10 ms
    skip = _acquire(stub, fast.handle, keys, pb.LOAD_POLICY_COST_AWARE)
    assert (skip.lease_id, len(skip.slots), skip.cached) == (0, 0, 2)

    slow = _register(stub, prefill=pb.PrefillModel(tokens_per_s=1))  # a chunk in 16 s
    take = _acquire(stub, slow.handle, keys, pb.LOAD_POLICY_COST_AWARE)
    assert [(s.index, s.source) for s in take.slots] == [(0, pb.TIER_L3), (1, pb.TIER_L3)]
    assert 0 < take.estimated_load_s < take.estimated_recompute_s
    assert take.estimated_recompute_s == pytest.approx(2 * CHUNK_TOKENS / 1.0)
    _release(stub, slow.handle, take.lease_id)


# ---------------------------------------------------------------------------------------- prefetch


def test_cancel_prefetch_drops_promotions_not_started(half_second_reads: ColdL3) -> None:
    stub = half_second_reads.stub()
    reg = _register(stub)
    keys = half_second_reads.chains[20]
    before = _tier(_stats(stub), pb.TIER_L3).hits
    reply = stub.Prefetch(pb.PrefetchRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    assert reply.ready == 0 and reply.prefetch_id != 0
    cancel = pb.CancelPrefetchRequest(handle=reg.handle, prefetch_id=reply.prefetch_id)
    cancelled = stub.CancelPrefetch(cancel, timeout=RPC_TIMEOUT_S).cancelled
    assert 0 < cancelled < len(keys)  # the daemon runs 4 promotions at once; the rest had not started
    assert stub.CancelPrefetch(cancel, timeout=RPC_TIMEOUT_S).cancelled == 0  # gone from the table
    promoted = len(keys) - cancelled
    wait_until(
        lambda: _tier(_stats(stub), pb.TIER_L3).hits - before == promoted, WAIT_S, "running promotions"
    )
    assert len(_held(stub, reg.handle, keys)) == promoted


def test_a_cancelled_prefetch_call_cancels_its_promotions(half_second_reads: ColdL3) -> None:
    stub = half_second_reads.stub()
    reg = _register(stub)
    keys = half_second_reads.chains[21]
    before = _tier(_stats(stub), pb.TIER_L3).hits
    call = stub.Prefetch.future(pb.PrefetchRequest(handle=reg.handle, keys=keys, timeout_s=20), timeout=30)
    time.sleep(0.3)  # the daemon starts 4 of the 8 promotions (each read takes 0.5 s)
    call.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        call.result()
    time.sleep(2.0)  # uncancelled, all 8 would be read by now
    assert _tier(_stats(stub), pb.TIER_L3).hits - before < len(keys)


def test_concurrent_prefetches_of_a_chain_read_each_chunk_once(half_second_reads: ColdL3) -> None:
    stubs = [half_second_reads.stub(), half_second_reads.stub()]  # two clients, two channels
    handles = [_register(s).handle for s in stubs]
    keys = half_second_reads.chains[22]
    before = _stats(stubs[0])
    ready: list[int] = []

    def prefetch(i: int) -> None:
        req = pb.PrefetchRequest(handle=handles[i], keys=keys, timeout_s=20)
        ready.append(stubs[i].Prefetch(req, timeout=30).ready)

    threads = [threading.Thread(target=prefetch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ready == [3, 3]
    after = _stats(stubs[0])
    assert _tier(after, pb.TIER_L3).hits - _tier(before, pb.TIER_L3).hits == len(keys)
    assert after.single_flight_joins > before.single_flight_joins


# ---------------------------------------------------------------------------------------- single flight


def _claim(stub: pb_grpc.KVCacheServiceStub, handle: bytes, keys: Sequence[bytes]) -> pb.ClaimPrefillResponse:
    reply: pb.ClaimPrefillResponse = stub.ClaimPrefill(
        pb.ClaimPrefillRequest(handle=handle, keys=keys, ttl_s=10), timeout=RPC_TIMEOUT_S
    )
    return reply


def _begin(
    stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse, keys: Sequence[bytes], seed: int
) -> int:
    """BeginStore + fill the slots; returns the ticket."""
    from tiercache.shm import SharedSegment

    begin = stub.BeginStore(pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    seg = SharedSegment.attach(reg.data_plane.shm_segment)
    try:
        for ref in begin.slots:
            start = ref.slot * reg.data_plane.slot_bytes
            seg.buffer[start : start + ref.nbytes] = payload(ref.index, seed)
    finally:
        seg.close()
    ticket: int = begin.ticket_id
    return ticket


def _commit(stub: pb_grpc.KVCacheServiceStub, handle: bytes, ticket: int, indices: Sequence[int]) -> int:
    req = pb.CommitStoreRequest(handle=handle, ticket_id=ticket, indices=indices)
    stored: int = stub.CommitStore(req, timeout=RPC_TIMEOUT_S).stored
    return stored


def test_followers_wait_for_incremental_publication(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    keys = make_keys(3, seed=401)
    lead = _claim(stub, reg.handle, keys)
    assert (lead.cached, lead.wait, lead.lead) == (0, 0, 3) and lead.claim_id
    follow = _claim(stub, reg.handle, keys)
    assert (follow.claim_id, follow.wait, follow.lead) == (0, 3, 0)
    short = _claim(stub, reg.handle, keys[:1])  # shares only the first chunk
    assert (short.wait, short.lead) == (1, 0)
    waits_before = _stats(stub).prefill.waits

    results: dict[str, int] = {}

    def wait(name: str, ks: Sequence[bytes]) -> None:
        req = pb.WaitPrefillRequest(handle=reg.handle, keys=ks, timeout_s=20)
        results[name] = stub.WaitPrefill(req, timeout=30).cached

    threads = [
        threading.Thread(target=wait, args=("follow", keys)),
        threading.Thread(target=wait, args=("short", keys[:1])),
    ]
    for t in threads:
        t.start()
    wait_until(lambda: _stats(stub).prefill.waits - waits_before >= 2, WAIT_S, "both waits")
    ticket = _begin(stub, reg, keys, seed=401)
    assert _commit(stub, reg.handle, ticket, [0]) == 1
    threads[1].join(timeout=WAIT_S)
    assert results == {"short": 1}  # the shared chunk is out; the leader still computes the rest
    assert threads[0].is_alive()
    with pytest.raises(grpc.RpcError) as info:
        _commit(stub, reg.handle, ticket, [0])  # already published
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "indices" in (info.value.details() or "")
    assert _commit(stub, reg.handle, ticket, [1, 2]) == 2
    threads[0].join(timeout=WAIT_S)
    assert results["follow"] == 3
    assert shm_load(stub, reg, keys) == [payload(i, 401) for i in range(3)]
    assert _stats(stub).prefill.active_claims >= 0


def test_an_aborted_leader_is_taken_over(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    keys = make_keys(2, seed=402)
    lead = _claim(stub, reg.handle, keys)
    assert _claim(stub, reg.handle, keys).wait == 2
    done: list[int] = []
    waiter = threading.Thread(
        target=lambda: done.append(
            stub.WaitPrefill(
                pb.WaitPrefillRequest(handle=reg.handle, keys=keys, timeout_s=20), timeout=30
            ).cached
        )
    )
    before = _stats(stub).prefill
    waiter.start()
    wait_until(lambda: _stats(stub).prefill.waits > before.waits, WAIT_S, "the wait")
    other = register(shared_daemon.stub())  # same tenant, same handle: owner checks are per handle
    release = pb.ReleasePrefillRequest(handle=other.handle, claim_id=lead.claim_id + 10_000)
    assert stub.ReleasePrefill(release, timeout=RPC_TIMEOUT_S).released == 0  # not a claim of ours
    release = pb.ReleasePrefillRequest(handle=reg.handle, claim_id=lead.claim_id)
    assert stub.ReleasePrefill(release, timeout=RPC_TIMEOUT_S).released == 2
    waiter.join(timeout=WAIT_S)
    assert done == [0]
    took = _claim(stub, reg.handle, keys)
    assert (took.lead, took.takeovers) == (2, 2) and took.claim_id
    assert _stats(stub).prefill.takeovers >= before.takeovers + 2
    stub.ReleasePrefill(
        pb.ReleasePrefillRequest(handle=reg.handle, claim_id=took.claim_id), timeout=RPC_TIMEOUT_S
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.WaitPrefill(
            pb.WaitPrefillRequest(handle=reg.handle, keys=keys, timeout_s=1, claim_id=999_999), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "claim_id" in (info.value.details() or "")


# ---------------------------------------------------------------------------------------- usage and metrics


def test_token_counters_and_usage_reports(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    keys = make_keys(2, seed=403)
    assert shm_store(stub, reg, keys, [payload(i, 403) for i in range(2)]) == 2
    before = _stats(stub)
    stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    assert len(shm_load(stub, reg, keys)) == 2
    leased = _tier(_stats(stub), pb.TIER_L2)
    assert leased.load_success_tokens == _tier(before, pb.TIER_L2).load_success_tokens  # not reported yet
    usage = pb.ReportUsageRequest(
        handle=reg.handle,
        effective_chunks=[pb.TierCount(tier=pb.TIER_L2, chunks=1)],
        recomputed_tokens=16,
        loaded_tokens=[pb.TierTokens(tier=pb.TIER_L2, tokens=2 * CHUNK_TOKENS)],
        effective_tokens=[pb.TierTokens(tier=pb.TIER_L2, tokens=3)],
    )
    stub.ReportUsage(usage, timeout=RPC_TIMEOUT_S)
    after = _stats(stub)
    b2, a2 = _tier(before, pb.TIER_L2), _tier(after, pb.TIER_L2)
    assert a2.lookup_hit_tokens - b2.lookup_hit_tokens == 2 * CHUNK_TOKENS
    assert a2.load_success_tokens - b2.load_success_tokens == 2 * CHUNK_TOKENS
    assert a2.effective_hit_tokens - b2.effective_hit_tokens == CHUNK_TOKENS + 3
    assert after.recomputed_tokens - before.recomputed_tokens == 16
    assert a2.latency_s > 0 and a2.bytes_per_s > 0
    bad = pb.ReportUsageRequest(handle=reg.handle, effective_chunks=[pb.TierCount(tier=0, chunks=1)])
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportUsage(bad, timeout=RPC_TIMEOUT_S)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "effective_chunks[0].tier" in (info.value.details() or "")
    bad = pb.ReportUsageRequest(handle=reg.handle, loaded_tokens=[pb.TierTokens(tier=0, tokens=1)])
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportUsage(bad, timeout=RPC_TIMEOUT_S)
    assert "loaded_tokens[0].tier" in (info.value.details() or "")


def test_metrics_export_token_rate_and_prefill_families(shared_daemon: DaemonProc) -> None:
    port = shared_daemon.args[shared_daemon.args.index("--metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=RPC_TIMEOUT_S) as reply:
        text = reply.read().decode()
    for name in (
        'tiercache_lookup_hit_tokens_total{tier="L2"}',
        'tiercache_load_success_tokens_total{tier="L2"}',
        'tiercache_effective_hit_tokens_total{tier="L2"}',
        "tiercache_recomputed_tokens_total",
        'tiercache_tier_read_latency_seconds{tier="L3"}',
        'tiercache_tier_read_bytes_per_second{tier="L3"}',
        "tiercache_prefill_active_claims",
        "tiercache_prefill_claimed_chunks",
        "tiercache_prefill_waits_total",
        "tiercache_prefill_takeovers_total",
        "tiercache_prefill_expired_claims_total",
    ):
        assert f"\n{name} " in text, name

"""Settlements carried by AcquireLoad and BeginStore (lease releases and usage reports without calls of
their own), through a real daemon process and the generated stubs."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest

from tests.daemon.conftest import (
    NAMESPACE,
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
    DaemonProc,
    free_port,
    make_keys,
    namespace_spec,
    new_daemon,
    payload,
    register,
    shm_store,
    write_tokens,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

CHUNK_TOKENS = NAMESPACE.layout.chunk_tokens


def _stats(stub: pb_grpc.KVCacheServiceStub) -> pb.StatsResponse:
    reply: pb.StatsResponse = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    return reply


def _l2(stats: pb.StatsResponse) -> pb.TierStats:
    return next(t for t in stats.tiers if t.tier == pb.TIER_L2)


def _acquire(
    stub: pb_grpc.KVCacheServiceStub, handle: bytes, keys: list[bytes], settle: pb.Settlement | None = None
) -> pb.AcquireLoadResponse:
    req = pb.AcquireLoadRequest(handle=handle, keys=keys, settle=settle)
    reply: pb.AcquireLoadResponse = stub.AcquireLoad(req, timeout=RPC_TIMEOUT_S)
    return reply


def _release(stub: pb_grpc.KVCacheServiceStub, handle: bytes, lease_id: int) -> bool:
    req = pb.ReleaseLoadRequest(handle=handle, lease_id=lease_id)
    return bool(stub.ReleaseLoad(req, timeout=RPC_TIMEOUT_S).released)


def test_acquire_load_settles_the_previous_lease_and_usage(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    keys = make_keys(2, seed=701)
    assert shm_store(stub, reg, keys, [payload(i, 701) for i in range(2)]) == 2
    first = _acquire(stub, reg.handle, keys)
    assert first.lease_id and len(first.slots) == 2
    before = _stats(stub)
    settle = pb.Settlement(
        release_lease_ids=[first.lease_id],
        effective_chunks=[pb.TierCount(tier=pb.TIER_L2, chunks=2)],
        recomputed_tokens=5,
    )
    second = _acquire(stub, reg.handle, keys, settle)
    assert second.lease_id and second.lease_id != first.lease_id
    after = _stats(stub)
    assert after.active_leases == before.active_leases  # the first ended, the second began
    assert _l2(after).effective_hit_tokens - _l2(before).effective_hit_tokens == 2 * CHUNK_TOKENS
    assert after.recomputed_tokens - before.recomputed_tokens == 5
    assert not _release(stub, reg.handle, first.lease_id)  # already ended by the settlement
    assert _release(stub, reg.handle, second.lease_id)


def test_begin_store_settles_and_foreign_leases_are_left_alone(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    spec = namespace_spec()
    spec.cache_salt = "settle-other"
    other = stub.Register(pb.RegisterRequest(namespace=spec, engine_id="t"), timeout=RPC_TIMEOUT_S)
    keys = make_keys(1, seed=702)
    assert shm_store(stub, reg, keys, [payload(0, 702)]) == 1
    mine, theirs = _acquire(stub, reg.handle, keys), _acquire(stub, reg.handle, keys)
    settle = pb.Settlement(release_lease_ids=[mine.lease_id])
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=make_keys(1, seed=703), settle=settle),
        timeout=RPC_TIMEOUT_S,
    )
    assert not _release(stub, reg.handle, mine.lease_id)  # ended by BeginStore's settlement
    stub.AbortStore(pb.AbortStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id), timeout=RPC_TIMEOUT_S)
    # Another handle's settlement cannot end this handle's lease: the id is ignored.
    foreign = pb.Settlement(release_lease_ids=[theirs.lease_id])
    _acquire(stub, other.handle, make_keys(1, seed=704), foreign)
    assert _release(stub, reg.handle, theirs.lease_id)


def test_a_bad_settlement_names_its_field(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    bad = pb.Settlement(effective_chunks=[pb.TierCount(tier=0, chunks=1)])
    with pytest.raises(grpc.RpcError) as info:
        _acquire(stub, reg.handle, make_keys(1, seed=705), bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "settle.effective_chunks[0].tier" in (info.value.details() or "")
    torn = pb.Settlement(read_keys=b"k" * 33)
    with pytest.raises(grpc.RpcError) as info:
        _acquire(stub, reg.handle, make_keys(1, seed=706), torn)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "settle.read_keys" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportUsage(pb.ReportUsageRequest(handle=reg.handle, read_keys=b"k" * 31), timeout=RPC_TIMEOUT_S)
    assert "read_keys" in (info.value.details() or "")


def test_chunks_read_through_the_published_index_count_as_l2_reads(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    keys = make_keys(3, seed=707)
    assert shm_store(stub, reg, keys, [payload(i, 707) for i in range(3)]) == 3
    before = _l2(_stats(stub)).hits
    settle = pb.Settlement(read_keys=b"".join(keys[:2]) + make_keys(1, seed=708)[0])  # (one not cached)
    _acquire(stub, reg.handle, make_keys(1, seed=709), settle)
    assert _l2(_stats(stub)).hits == before + 2


# ------------------------------------------------------------------------------------- true hit accounting


@pytest.fixture(scope="module")
def tenants_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, int]]:
    """A daemon with tenants ``team-a`` and ``team-b`` and /metrics on a free port."""
    tmp: Path = tmp_path_factory.mktemp("hits")
    port = free_port()
    tokens = write_tokens(tmp / "tokens.toml")
    d = new_daemon(tmp, ["--tokens-file", str(tokens), "--metrics-port", str(port), "--metrics-public"])
    try:
        yield d.start(), port
    finally:
        d.cleanup()


def _hits(stub: pb_grpc.KVCacheServiceStub, metadata: Sequence[tuple[str, str]]) -> tuple[int, int]:
    """A tenant's own (loaded, effective) tokens from L2, from its Stats."""
    l2 = _l2(stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=metadata))
    return int(l2.load_success_tokens), int(l2.effective_hit_tokens)


def _metric(port: int, name: str, labels: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=RPC_TIMEOUT_S).read().decode()
    found = re.search(rf"^{name}{{{re.escape(labels)}}} (\S+)$", body, re.MULTILINE)
    assert found is not None, f"{name}{{{labels}}} not in /metrics"
    return float(found.group(1))


def _exported(port: int) -> tuple[float, float, float, float]:
    """/metrics: L2's loaded and effective tokens, cache-wide and team-a's."""
    tenant = 'tenant="team-a",tier="L2"'
    return (
        _metric(port, "tiercache_load_success_tokens_total", 'tier="L2"'),
        _metric(port, "tiercache_effective_hit_tokens_total", 'tier="L2"'),
        _metric(port, "tiercache_tenant_load_success_tokens_total", tenant),
        _metric(port, "tiercache_tenant_effective_hit_tokens_total", tenant),
    )


def test_a_lease_released_unused_counts_nothing_a_reported_copy_counts(
    tenants_metrics: tuple[DaemonProc, int],
) -> None:
    d, port = tenants_metrics
    stub = d.stub()
    reg = register(stub, TENANT_A)
    keys = make_keys(2, seed=706)
    assert shm_store(stub, reg, keys, [payload(i, 706) for i in range(2)], TENANT_A) == 2

    def acquire(settle: pb.Settlement | None = None) -> pb.AcquireLoadResponse:
        req = pb.AcquireLoadRequest(handle=reg.handle, keys=keys, settle=settle)
        reply: pb.AcquireLoadResponse = stub.AcquireLoad(req, timeout=RPC_TIMEOUT_S, metadata=TENANT_A)
        assert reply.lease_id and len(reply.slots) == 2
        return reply

    # Leased, then released unused: by ReleaseLoad, and by a settlement that carries no usage.
    first = acquire()
    release = pb.ReleaseLoadRequest(handle=reg.handle, lease_id=first.lease_id)
    assert stub.ReleaseLoad(release, timeout=RPC_TIMEOUT_S, metadata=TENANT_A).released
    second = acquire()
    third = acquire(pb.Settlement(release_lease_ids=[second.lease_id]))
    assert _hits(stub, TENANT_A) == (0, 0)
    assert _exported(port) == (0, 0, 0, 0)

    # The engine reports its copy (tokens per source tier, not whole chunks) with the release.
    copied = 2 * CHUNK_TOKENS - 3
    settle = pb.Settlement(
        release_lease_ids=[third.lease_id],
        loaded_tokens=[pb.TierTokens(tier=pb.TIER_L2, tokens=copied)],
        effective_tokens=[pb.TierTokens(tier=pb.TIER_L2, tokens=copied)],
    )
    fourth = acquire(settle)
    assert _hits(stub, TENANT_A) == (copied, copied)
    assert _hits(stub, TENANT_B) == (0, 0)  # another tenant's view has none of it
    assert _exported(port) == (copied, copied, copied, copied)
    release = pb.ReleaseLoadRequest(handle=reg.handle, lease_id=fourth.lease_id)
    assert stub.ReleaseLoad(release, timeout=RPC_TIMEOUT_S, metadata=TENANT_A).released
    assert _hits(stub, TENANT_A) == (copied, copied)


def test_a_bad_loaded_tier_names_its_field(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    bad = pb.Settlement(loaded_tokens=[pb.TierTokens(tier=0, tokens=1)])
    with pytest.raises(grpc.RpcError) as info:
        _acquire(stub, reg.handle, make_keys(1, seed=707), bad)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "settle.loaded_tokens[0].tier" in (info.value.details() or "")

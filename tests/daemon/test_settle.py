"""Settlements carried by AcquireLoad and BeginStore (lease releases and usage reports without calls of
their own), through a real daemon process and the generated stubs."""

from __future__ import annotations

import grpc
import pytest

from tests.daemon.conftest import (
    NAMESPACE,
    RPC_TIMEOUT_S,
    DaemonProc,
    make_keys,
    namespace_spec,
    payload,
    register,
    shm_store,
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

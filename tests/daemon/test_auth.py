"""Tenant isolation with a tokens file: tenant B, with its own valid token and tenant A's exact keys, gets a
miss; A's handle is refused to B; calls without a valid token are refused with a clear status."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    DaemonProc,
    StartDaemon,
    make_keys,
    namespace_spec,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

A = [("authorization", "Bearer token-of-a")]
B = [("authorization", "Bearer token-of-b")]


@pytest.fixture
def daemon(start_daemon: StartDaemon, tmp_path: Path) -> DaemonProc:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"token-of-a" = "team-a"\n"token-of-b" = "team-b"\n')
    tokens.chmod(0o600)
    return start_daemon("--tokens-file", str(tokens))


def fails(call: Callable[[], object], codes: tuple[grpc.StatusCode, ...], fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() in codes, (info.value.code(), info.value.details())
    assert fragment in (info.value.details() or "")


def test_tenants_are_isolated(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg_a = register(stub, A)
    keys = make_keys(2, seed=80)
    chunks = [payload(i, seed=80) for i in range(2)]
    assert shm_store(stub, reg_a, keys, chunks, A) == 2

    reg_b = register(stub, B)  # the very same namespace
    assert reg_b.handle != reg_a.handle
    miss = stub.Lookup(pb.LookupRequest(handle=reg_b.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=B)
    assert miss.chunks == 0
    assert shm_load(stub, reg_b, keys, B) == []  # nothing leased
    denied = (grpc.StatusCode.NOT_FOUND,)  # as if nobody had registered it: nothing leaks
    for call in (
        lambda: stub.Lookup(
            pb.LookupRequest(handle=reg_a.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=B
        ),
        lambda: stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=reg_a.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=B
        ),
        lambda: list(
            stub.StreamLoad(
                pb.StreamLoadRequest(handle=reg_a.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=B
            )
        ),
        lambda: stub.Purge(pb.PurgeRequest(handle=reg_a.handle), timeout=RPC_TIMEOUT_S, metadata=B),
    ):
        fails(call, denied, f"handle: {reg_a.handle.hex()} is not registered")
    # A's ticket cannot be committed under B's handle either.
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg_a.handle, keys=make_keys(1, seed=81)),
        timeout=RPC_TIMEOUT_S,
        metadata=A,
    )
    fails(
        lambda: stub.CommitStore(
            pb.CommitStoreRequest(handle=reg_b.handle, ticket_id=begin.ticket_id),
            timeout=RPC_TIMEOUT_S,
            metadata=B,
        ),
        (grpc.StatusCode.NOT_FOUND,),
        "ticket_id:",
    )
    assert stub.AbortStore(
        pb.AbortStoreRequest(handle=reg_a.handle, ticket_id=begin.ticket_id),
        timeout=RPC_TIMEOUT_S,
        metadata=A,
    ).aborted

    # B's event stream carries B's events only.
    b_keys = make_keys(1, seed=82)
    assert shm_store(stub, reg_b, b_keys, [payload(0, seed=82)], B) == 1
    events = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), metadata=B, timeout=RPC_TIMEOUT_S)
    try:
        seen = []
        for event in events:
            seen.append(event.handle)
            if event.key == b_keys[0]:
                break
    finally:
        events.cancel()
    assert set(seen) == {reg_b.handle}

    assert shm_load(stub, reg_a, keys, A) == chunks  # A's data is intact


def test_missing_or_bad_tokens_are_refused(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    unauth = (grpc.StatusCode.UNAUTHENTICATED,)
    request = pb.RegisterRequest(namespace=namespace_spec())
    fails(lambda: stub.Register(request, timeout=RPC_TIMEOUT_S), unauth, "authorization: missing")
    fails(
        lambda: stub.Register(request, timeout=RPC_TIMEOUT_S, metadata=[("authorization", "Bearer nope")]),
        unauth,
        "authorization: unknown token",
    )
    fails(
        lambda: stub.Stats(
            pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=[("authorization", "Basic abc")]
        ),
        unauth,
        "expected 'Bearer <token>'",
    )
    diag = pb_grpc.DiagnosticsStub(daemon.channel())
    fails(
        lambda: diag.Echo(pb.EchoMessage(data=b"x"), timeout=RPC_TIMEOUT_S), unauth, "authorization: missing"
    )
    assert diag.Echo(pb.EchoMessage(data=b"x"), timeout=RPC_TIMEOUT_S, metadata=A).data == b"x"
    # Health checks need no token.
    health = health_pb2_grpc.HealthStub(daemon.channel())
    reply = health.Check(
        health_pb2.HealthCheckRequest(service="tiercache.v1.KVCacheService"), timeout=RPC_TIMEOUT_S
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert len(stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=A).tiers) == 3

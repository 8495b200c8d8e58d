"""No side channels between tenants, through a real daemon with two tokens.

The attacks: B counts A's activity through event sequence numbers (one global counter: B's own event came
numbered after all of A's, and RESYNC probes bracketed the latest number); B learns which namespaces (model,
LoRA) A registered from PERMISSION_DENIED on A's handle against NOT_FOUND on an unknown one; B predicts
lease, ticket and claim ids (they counted 1, 2, 3, ... over every tenant). Now each tenant's events are
numbered in a stream of their own, a handle that is not the caller's is NOT_FOUND exactly as an unknown one,
and ids are 63 random bits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.daemon.conftest import (
    DAEMON_ARGS,
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
    DaemonProc,
    make_keys,
    payload,
    register,
    shm_store,
    write_tokens,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.testing.plugin import StartDaemon


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    return DAEMON_ARGS


@pytest.fixture
def daemon(start_daemon: StartDaemon, tmp_path: Path) -> DaemonProc:
    return start_daemon("--tokens-file", str(write_tokens(tmp_path / "tokens.toml")))


def _first_event(stub: Any, md: Any, after: int = 0, epoch: int = 0) -> pb.CacheEvent:
    call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=after, epoch=epoch), timeout=30, metadata=md)
    try:
        event: pb.CacheEvent = next(call)
        return event
    finally:
        call.cancel()


def test_event_sequences_do_not_count_another_tenants_events(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg_a, reg_b = register(stub, TENANT_A), register(stub, TENANT_B)
    keys = make_keys(10, seed=61)
    assert shm_store(stub, reg_a, keys, [payload(i, 61) for i in range(10)], TENANT_A) == 10
    assert shm_store(stub, reg_b, keys[:1], [payload(0, 62)], TENANT_B) == 1
    own = _first_event(stub, TENANT_B)
    assert own.kind == pb.CacheEvent.KIND_STORED and own.handle == reg_b.handle
    assert own.sequence == 1  # old code: 11, after A's 10 stores
    # a RESYNC probe past B's own latest event (one chunk: an event per tier at most) but below the number
    # of A's events (two tiers of 10 chunks): a gap now; on the old code, none up to A's latest
    probe = _first_event(stub, TENANT_B, after=8, epoch=own.epoch)
    assert probe.kind == pb.CacheEvent.KIND_RESYNC
    first_a = _first_event(stub, TENANT_A)
    assert (first_a.handle, first_a.sequence) == (reg_a.handle, 1)


def test_another_tenants_handle_is_not_found_like_an_unknown_one(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg_a = register(stub, TENANT_A)
    register(stub, TENANT_B)
    keys = make_keys(1, seed=63)
    answers = {}
    for name, handle in (("foreign", reg_a.handle), ("unknown", bytes(16))):
        with pytest.raises(grpc.RpcError) as info:
            stub.Lookup(pb.LookupRequest(handle=handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=TENANT_B)
        answers[name] = (info.value.code(), (info.value.details() or "").replace(handle.hex(), "<handle>"))
    assert answers["foreign"] == answers["unknown"]  # old code: PERMISSION_DENIED "belongs to another tenant"
    assert answers["foreign"][0] == grpc.StatusCode.NOT_FOUND


def test_lease_ticket_and_claim_ids_are_unguessable(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg = register(stub, TENANT_A)
    keys = make_keys(3, seed=64)
    assert shm_store(stub, reg, keys, [payload(i, 64) for i in range(3)], TENANT_A) == 3
    ids = []
    for i in range(3):
        ticket = stub.BeginStore(
            pb.BeginStoreRequest(handle=reg.handle, keys=make_keys(1, seed=65 + i)),
            timeout=RPC_TIMEOUT_S,
            metadata=TENANT_A,
        )
        lease = stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=TENANT_A
        )
        claim = stub.ClaimPrefill(
            pb.ClaimPrefillRequest(handle=reg.handle, keys=make_keys(2, seed=70 + i)),
            timeout=RPC_TIMEOUT_S,
            metadata=TENANT_A,
        )
        ids += [ticket.ticket_id, lease.lease_id, claim.claim_id]
    assert len(set(ids)) == len(ids) and 0 not in ids
    # 63 random bits each: all of them below 2**40 has a chance of 2**-207 (old code: 1, 2, 3, ...)
    assert max(ids) >= 2**40 and all(i < 2**63 for i in ids)
    assert sorted(ids) != list(range(min(ids), min(ids) + len(ids)))

"""A real daemon refuses a commit after its store ticket expired, naming the ticket, and the late writer's
slots are not handed to the next store while its quarantine lasts."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.daemon.conftest import RPC_TIMEOUT_S, DaemonProc, make_keys, register
from tiercache.proto import tiercache_pb2 as pb


def _wait_expired(daemon: DaemonProc, at_least: int) -> None:
    """Wait (bounded) until the daemon has reaped ``at_least`` leases or tickets (Stats reaps)."""
    stub = daemon.stub()
    deadline = time.monotonic() + 30
    while stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).expired_leases < at_least:
        assert time.monotonic() < deadline, "the ticket never expired"
        time.sleep(0.05)


def test_a_commit_after_the_ticket_expired_is_refused(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    reg = register(stub)
    before = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).expired_leases
    keys = make_keys(2, seed=901)
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=keys, ttl_s=0.2), timeout=RPC_TIMEOUT_S
    )
    assert len(begin.slots) == 2
    _wait_expired(shared_daemon, before + 1)
    with pytest.raises(grpc.RpcError) as info:
        stub.CommitStore(
            pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id), timeout=RPC_TIMEOUT_S
        )
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"store ticket {begin.ticket_id} expired" in (info.value.details() or "")
    assert "ticket_id" in (info.value.details() or "")
    # The chunks were never published, and the late slots are not the next store's.
    found = stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    assert found.chunks == 0
    nxt = stub.BeginStore(pb.BeginStoreRequest(handle=reg.handle, keys=keys, ttl_s=30), timeout=RPC_TIMEOUT_S)
    assert not {s.slot for s in begin.slots} & {s.slot for s in nxt.slots}
    stub.AbortStore(pb.AbortStoreRequest(handle=reg.handle, ticket_id=nxt.ticket_id), timeout=RPC_TIMEOUT_S)

"""Fairness between tenants through a real daemon: one tenant cannot take what the others need.

The attacks: B holds many long waits (WaitPrefill up to 60 s), opens many event subscriptions, registers
many namespaces, floods the bounded tables. On the old code B's 32 waits took every thread of the one wait
pool, so that A's 0.01 s WaitPrefill waited behind them for as long as they lasted. Now each tenant has a
capped pool of its own: B's waits beyond its cap are refused at once, RESOURCE_EXHAUSTED naming the cap,
and A's call is answered while B's waits still hold theirs. No assertion is on a duration: every deadline
is generous, only the old code runs into one (B's waits outlast A's 30 s deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.daemon.conftest import (
    DAEMON_ARGS,
    NAMESPACE,
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
    DaemonProc,
    make_keys,
    namespace_spec,
    register,
    write_tokens,
)
from tiercache.cache import Prefetch
from tiercache.daemon.handles import Owners
from tiercache.daemon.prefetches import PrefetchTable
from tiercache.keys import Namespace
from tiercache.proto import tiercache_pb2 as pb
from tiercache.testing.plugin import StartDaemon

WAITS, SUBSCRIPTIONS = 32, 16
"""The daemon's default caps per tenant (tiercache.daemon.fairness.FairShares)."""
NAMESPACES = 8  # --tenant-namespaces of the daemon (the default, 1024, takes long to register)
B_WAITS = WAITS + 8  # more than the old shared pool had threads (32)


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    return DAEMON_ARGS


@pytest.fixture
def daemon(start_daemon: StartDaemon, tmp_path: Path) -> DaemonProc:
    tokens = write_tokens(tmp_path / "tokens.toml")
    return start_daemon("--tokens-file", str(tokens), "--tenant-namespaces", str(NAMESPACES))


def _code(fut: Future[Any]) -> grpc.StatusCode:
    exc = fut.exception()
    return grpc.StatusCode.OK if exc is None else exc.code()  # type: ignore[attr-defined, no-any-return]


def _settled(futures: Sequence[Future[Any]], count: int, within_s: float) -> None:
    """Give ``count`` of the futures up to ``within_s`` to finish (on the old code they never do)."""
    deadline = time.monotonic() + within_s
    while sum(f.done() for f in futures) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_tenants_long_waits_do_not_hold_another_tenants_call(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg_a, reg_b = register(stub, TENANT_A), register(stub, TENANT_B)
    b_keys = make_keys(4, seed=71)
    claim = stub.ClaimPrefill(
        pb.ClaimPrefillRequest(handle=reg_b.handle, keys=b_keys, ttl_s=120),
        timeout=RPC_TIMEOUT_S,
        metadata=TENANT_B,
    )
    assert claim.claim_id and claim.lead == 4
    wait = pb.WaitPrefillRequest(handle=reg_b.handle, keys=b_keys, timeout_s=60)
    b_waits = [stub.WaitPrefill.future(wait, timeout=120, metadata=TENANT_B) for _ in range(B_WAITS)]
    try:
        _settled(b_waits, B_WAITS - WAITS, within_s=10.0)
        refused = [f for f in b_waits if f.done()]
        a_keys = make_keys(2, seed=72)
        answer = stub.WaitPrefill(  # old code: queued behind B's waits until its deadline
            pb.WaitPrefillRequest(handle=reg_a.handle, keys=a_keys, timeout_s=0.01),
            timeout=30,
            metadata=TENANT_A,
        )
        assert answer.cached == 0
        assert len(refused) == B_WAITS - WAITS
        for fut in refused:
            assert _code(fut) == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = fut.exception().details()  # type: ignore[union-attr]
            assert f"quota waits = {WAITS} of tenant 'team-b' reached" in details
        assert not any(f.done() for f in b_waits if f not in refused)  # B still holds its share of waits
    finally:
        stub.ReleasePrefill(
            pb.ReleasePrefillRequest(handle=reg_b.handle, claim_id=claim.claim_id),
            timeout=RPC_TIMEOUT_S,
            metadata=TENANT_B,
        )
        for fut in b_waits:
            fut.exception(timeout=RPC_TIMEOUT_S)  # the released claim ends the waits
    # B's waits are over: its pool takes new ones again
    again = stub.WaitPrefill(
        pb.WaitPrefillRequest(handle=reg_b.handle, keys=b_keys, timeout_s=0.01), timeout=30, metadata=TENANT_B
    )
    assert again.cached == 0


def test_subscriptions_are_capped_per_tenant(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    register(stub, TENANT_A), register(stub, TENANT_B)
    live = []
    try:
        for _ in range(SUBSCRIPTIONS):
            call = stub.WatchEvents(pb.WatchEventsRequest(), timeout=120, metadata=TENANT_B)
            call.initial_metadata()  # the subscription is in place
            live.append(call)
        extra = stub.WatchEvents(pb.WatchEventsRequest(), timeout=RPC_TIMEOUT_S, metadata=TENANT_B)
        with pytest.raises(grpc.RpcError) as info:
            next(extra)  # old code: no cap, the stream stays open (DEADLINE_EXCEEDED here)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
        assert f"quota subscriptions = {SUBSCRIPTIONS} of tenant 'team-b'" in (info.value.details() or "")
        mine = stub.WatchEvents(pb.WatchEventsRequest(), timeout=120, metadata=TENANT_A)
        mine.initial_metadata()  # A subscribes as ever
        mine.cancel()
    finally:
        for call in live:
            call.cancel()


def test_namespaces_are_capped_per_tenant(daemon: DaemonProc) -> None:
    stub = daemon.stub()

    def reg(i: int, md: Any) -> pb.RegisterResponse:
        ns = Namespace(model_id=f"m/{i}", revision="r1", layout=NAMESPACE.layout, tokenizer_id="tok")
        reply: pb.RegisterResponse = stub.Register(
            pb.RegisterRequest(namespace=namespace_spec(ns), engine_id="e"),
            timeout=RPC_TIMEOUT_S,
            metadata=md,
        )
        return reply

    for i in range(NAMESPACES):
        reg(i, TENANT_B)
    assert reg(0, TENANT_B).handle  # one it holds already: registered again
    with pytest.raises(grpc.RpcError) as info:
        reg(NAMESPACES, TENANT_B)  # old code: registered
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    assert f"quota namespaces = {NAMESPACES} of tenant 'team-b'" in (info.value.details() or "")
    assert reg(NAMESPACES, TENANT_A).handle  # A's share is its own


def test_a_tenant_flooding_a_bounded_table_forgets_only_its_own_entries() -> None:
    owners = Owners(capacity=4)
    owners.add(1, b"a" * 16, "team-a")
    for ident in range(100, 110):  # B floods the table of prefill claims
        owners.add(ident, b"b" * 16, "team-b")
    assert owners.owned(1, b"a" * 16)  # old code: A's claim forgotten, oldest first across tenants
    assert not owners.owned(100, b"b" * 16) and owners.owned(109, b"b" * 16)


async def test_a_tenant_flooding_the_prefetch_table_forgets_only_its_own_entries() -> None:
    def running() -> Prefetch:
        return Prefetch([Future()], threading.Event())  # a promotion that has not finished

    table = PrefetchTable(capacity=4)
    a_id = table.add(b"a" * 16, running(), "team-a")
    b_ids = [table.add(b"b" * 16, running(), "team-b") for _ in range(10)]  # B floods the table
    assert table.cancel(a_id, b"a" * 16) == 1  # old code: A's prefetch forgotten, oldest first
    assert table.cancel(b_ids[0], b"b" * 16) is None and table.cancel(b_ids[-1], b"b" * 16) == 1

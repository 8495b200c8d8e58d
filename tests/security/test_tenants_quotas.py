"""Quotas that cover borrowing, through a real daemon with two tenants of 4 L2 slots each in an 8-slot L2.

The attack: B stores past its share (its older chunks trimmed down into L3), then one AcquireLoad of all its
chunks promotes them from L3 into the free space and leases them for the lease's lifetime. On the old code
B then held 6 of the 8 slots, all leased: A, below its share, was refused RESOURCE_EXHAUSTED on its next
store and lost its own chunks making room. Now a promotion counts against the tenant that causes it (B's
own chunks are trimmed first, and a promotion that cannot fit B's quota is not made): B's lease stops at its
share, and A stores within its own without losing a chunk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.testing.plugin import StartDaemon

SLOT = 64 << 10  # the test daemon's slot: one chunk takes one slot of L2
TOKENS = '[tokens]\n"token-of-a" = "team-a"\n"token-of-b" = "team-b"\n'
QUOTAS = f'\n[quotas.default]\nl2_bytes = "{4 * SLOT // 1024}K"\n'


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    return DAEMON_ARGS


@pytest.fixture
def daemon(start_daemon: StartDaemon, tmp_path: Path) -> DaemonProc:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS + QUOTAS)
    tokens.chmod(0o600)
    return start_daemon(
        "--tokens-file", str(tokens), "--l1-device", "none", "--l2-bytes", f"{8 * SLOT // 1024}K",
        "--lease-ttl-s", "60",
    )  # fmt: skip


def _l2(stub: Any, md: Any) -> pb.TierStats:
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=md)
    return next(t for t in stats.tiers if t.tier == pb.TIER_L2)


def _written_through(stub: Any) -> None:
    """Wait (with a deadline) until the daemon has no write-down queued or in flight."""
    deadline = time.monotonic() + 30.0
    while stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S, metadata=TENANT_B).pending_writes:
        assert time.monotonic() < deadline, "the daemon's write-downs did not drain in 30 s"
        time.sleep(0.02)


def test_a_tenant_within_its_share_is_not_refused_for_anothers_borrowed_space(daemon: DaemonProc) -> None:
    stub = daemon.stub()
    reg_a, reg_b = register(stub, TENANT_A), register(stub, TENANT_B)
    a_keys = make_keys(4, seed=1)
    assert shm_store(stub, reg_a, a_keys[:2], [payload(i, 1) for i in range(2)], TENANT_A) == 2
    b_keys: list[bytes] = []
    for seed in (10, 11, 12):  # B stores 12 chunks: its 4-slot share in L2, the rest trimmed down to L3
        _written_through(stub)
        keys = make_keys(4, seed=seed)
        assert shm_store(stub, reg_b, keys, [payload(i, seed) for i in range(4)], TENANT_B) == 4
        b_keys += keys
    _written_through(stub)
    older = b_keys[:8]  # only in L3 now
    look = stub.Lookup(
        pb.LookupRequest(handle=reg_b.handle, keys=older), timeout=RPC_TIMEOUT_S, metadata=TENANT_B
    )
    assert look.chunks == 8 and {c.tier: c.chunks for c in look.by_tier}.get(pb.TIER_L2, 0) == 0

    lease = stub.AcquireLoad(  # promotes B's L3 chunks into L2 and leases them (held for 60 s)
        pb.AcquireLoadRequest(handle=reg_b.handle, keys=older, ttl_s=60),
        timeout=RPC_TIMEOUT_S,
        metadata=TENANT_B,
    )
    assert (
        1 <= len(lease.slots) <= 4
    )  # B's lease stops at its share (old code: 6 slots, all of the free space)
    assert _l2(stub, TENANT_B).used_bytes <= 4 * SLOT

    # A, below its share (2 of 4 slots), stores 2 more: room is there, and none of its chunks goes.
    rest = [payload(i, 1) for i in range(2, 4)]
    assert shm_store(stub, reg_a, a_keys[2:], rest, TENANT_A) == 2  # old code: RESOURCE_EXHAUSTED
    l2_a = _l2(stub, TENANT_A)
    assert (l2_a.chunks, l2_a.evictions) == (4, 0)
    look = stub.Lookup(
        pb.LookupRequest(handle=reg_a.handle, keys=a_keys), timeout=RPC_TIMEOUT_S, metadata=TENANT_A
    )
    assert {c.tier: c.chunks for c in look.by_tier}[pb.TIER_L2] == 4
    stub.ReleaseLoad(
        pb.ReleaseLoadRequest(handle=reg_b.handle, lease_id=lease.lease_id),
        timeout=RPC_TIMEOUT_S,
        metadata=TENANT_B,
    )

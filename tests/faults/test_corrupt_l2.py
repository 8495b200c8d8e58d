"""A real daemon with ``--l2-verify-loads``: bytes flipped in its shared memory after commit are never
served (the chunk is a counted miss, and what is loaded is the intact copy or nothing)."""

from __future__ import annotations

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    StartDaemon,
    make_keys,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.shm import SharedSegment


def test_flipped_shared_memory_is_never_served(start_daemon: StartDaemon) -> None:
    d = start_daemon("--l2-verify-loads")
    stub = d.stub()
    reg = register(stub)
    keys = make_keys(2, seed=950)
    chunks = [payload(i, seed=950) for i in range(2)]
    assert shm_store(stub, reg, keys, chunks) == 2
    acq = stub.AcquireLoad(pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    slot = next(r.slot for r in acq.slots if r.index == 0)
    stub.ReleaseLoad(pb.ReleaseLoadRequest(handle=reg.handle, lease_id=acq.lease_id), timeout=RPC_TIMEOUT_S)
    seg = SharedSegment.attach(reg.data_plane.shm_segment)
    try:
        at = slot * reg.data_plane.slot_bytes + 123
        seg.buffer[at] ^= 0xFF  # a stray write into the daemon's slot after commit
    finally:
        seg.close()
    got = shm_load(stub, reg, keys)
    assert got == chunks[: len(got)]  # the intact copy (promoted back from L3) or nothing: never the flip
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    l2 = next(t for t in stats.tiers if t.tier == pb.TIER_L2)
    assert l2.corrupt_reads == 1

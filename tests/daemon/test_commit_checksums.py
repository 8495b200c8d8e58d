"""CommitStore's ``checksums`` (issue 30), against a real daemon process with ``--l2-verify-loads``.

An engine that copied its KV into the slots and hashed it in the same pass sends the checksums with the
commit; the daemon keeps them instead of reading the slots again. A right one serves the chunk; a wrong
one makes that chunk a miss at the next check (here: before a lease), never wrong bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    make_keys,
    map_segment,
    new_daemon,
    payload,
    register,
    shm_load,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.testing.daemon import DaemonProcess as DaemonProc


@pytest.fixture
def verifying(tmp_path: Path) -> Iterator[DaemonProc]:
    d = new_daemon(tmp_path, ["--l2-verify-loads"], prefix=f"tiercache-test-{secrets.token_hex(4)}").start()
    try:
        yield d
    finally:
        d.cleanup()


def _store(
    stub: pb_grpc.KVCacheServiceStub,
    reg: pb.RegisterResponse,
    keys: list[bytes],
    chunks: list[bytes],
    sums: dict[int, int],
) -> int:
    begin = stub.BeginStore(pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    seg = map_segment(reg)
    try:
        for ref in begin.slots:
            start = ref.slot * reg.data_plane.slot_bytes
            seg.buffer[start : start + ref.nbytes] = chunks[ref.index]
    finally:
        seg.close()
    request = pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id, checksums=sums)
    stored: int = stub.CommitStore(request, timeout=RPC_TIMEOUT_S).stored
    return stored


def test_the_engines_checksums_are_kept_and_a_wrong_one_is_a_miss(verifying: DaemonProc) -> None:
    stub = verifying.stub()
    reg = register(stub)
    keys = make_keys(3, seed=300)
    chunks = [payload(i, seed=300) for i in range(3)]
    right = [xxhash.xxh3_64_intdigest(c) for c in chunks]
    assert _store(stub, reg, keys, chunks, {0: right[0], 1: right[1] ^ 1, 2: right[2]}) == 3
    assert shm_load(stub, reg, keys) == chunks[:1]  # the lease stops before the chunk with the wrong checksum
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert [t.corrupt_reads for t in stats.tiers if t.tier == pb.TIER_L2] == [1]


def test_right_checksums_serve_every_chunk(verifying: DaemonProc) -> None:
    stub = verifying.stub()
    reg = register(stub)
    keys = make_keys(3, seed=301)
    chunks = [payload(i, seed=301) for i in range(3)]
    sums = {i: xxhash.xxh3_64_intdigest(c) for i, c in enumerate(chunks)}
    assert _store(stub, reg, keys, chunks, {0: sums[0], 2: sums[2]}) == 3  # chunk 1: hashed by the daemon
    assert shm_load(stub, reg, keys) == chunks

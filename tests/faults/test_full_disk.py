"""L3 on a real, small filesystem (tmpfs, and a loop-mounted ext4): a small disk, then a full one.

A disk too small for the configured capacity gives a smaller L3 (logged), or a clear refusal naming the
option when there is no useful room; once the filesystem is full (a filler file takes every free block),
commits fail as a CapacityError (``DiskFullError``) with nothing committed, chunks stored before go on
reading with every byte right, and the tier never dies of SIGBUS (no shared writable map over unallocated
blocks). In the daemon the same fill turns write-downs into counted drops while stores and loads go on.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    StartDaemon,
    make_keys,
    payload,
    register,
    shm_load,
    shm_store,
)
from tests.faults.smallfs import fill, mount_ext4, mount_tmpfs
from tiercache.errors import CapacityError, InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.lmdb_config import free_bytes_at
from tiercache.tiers.lmdb_io import DiskFullError

FS_BYTES = 16 << 20
CHUNK = 64 << 10

Mount = Callable[[Path], contextlib.AbstractContextManager[Path]]


def _tmpfs(where: Path) -> contextlib.AbstractContextManager[Path]:
    return mount_tmpfs(where / "fs", FS_BYTES)


def _ext4(where: Path) -> contextlib.AbstractContextManager[Path]:
    return mount_ext4(where / "fs", where / "ext4.img", FS_BYTES)


@pytest.fixture(params=[_tmpfs, _ext4], ids=["tmpfs", "ext4"])
def small_fs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, bool]]:
    """A small mounted filesystem, and whether a failed preallocation gives its blocks back (tmpfs does;
    ext4 may keep what it allocated, and L3 then fills its capacity before the disk)."""
    mount: Mount = request.param
    with mount(tmp_path) as where:
        yield where, mount is _tmpfs


def _chunk(i: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(i.to_bytes(4, "little"), digest_size=4).digest(), "little")
    return torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _cid(i: int) -> bytes:
    return hashlib.blake2b(i.to_bytes(4, "little"), digest_size=32).digest()


def _put(tier: LmdbTier, i: int) -> None:
    (slot,) = tier.reserve([_cid(i)], [CHUNK])
    slot.buffer.copy_(_chunk(i))
    try:
        tier.commit([slot])
    except BaseException:
        tier.abort([slot])
        raise


def _read(tier: LmdbTier, i: int) -> bool:
    dst = torch.empty(CHUNK, dtype=torch.uint8)
    ok = tier.read_into([_cid(i)], [dst])[0]
    if ok:
        assert torch.equal(dst, _chunk(i)), f"chunk {i} came back with wrong bytes"
    return ok


def test_a_disk_too_small_for_the_capacity_gives_a_smaller_l3_then_fails_stores_cleanly(
    small_fs: tuple[Path, bool],
) -> None:
    where, gives_back = small_fs
    tier = LmdbTier(LmdbTierConfig(path=str(where / "l3"), capacity_bytes=1 << 30))
    try:
        capacity = tier.usage().capacity_bytes
        assert (1 << 20) <= capacity <= FS_BYTES, capacity  # shrunk to the disk, not refused
        stored = list(range(16))
        for i in stored:
            _put(tier, i)
        filler = fill(where)
        failures = disk_full = 0
        for i in range(100, 400):
            try:
                _put(tier, i)
            except CapacityError as exc:  # the disk (DiskFullError), the map or the fitted capacity
                failures += 1
                disk_full += isinstance(exc, DiskFullError)
                assert not tier.contains([_cid(i)])[0], "a failed commit left a chunk visible"
        assert failures > 0, "nothing ever filled: the scenario did not happen"
        if gives_back:
            assert disk_full > 0, "the filesystem never filled: the scenario did not happen"
        assert tier.usage().reserved_bytes == 0
        assert all(_read(tier, i) for i in stored), "a chunk stored before the disk filled was lost"
        filler.unlink()
        assert tier.delete([_cid(i) for i in range(100, 400)] + [_cid(0)]) >= 1
        _put(tier, 1000)  # room again: stores go on
        assert _read(tier, 1000)
    finally:
        tier.close()


def test_an_l3_too_big_for_the_disk_leaves_the_rest_of_the_host_its_share(
    small_fs: tuple[Path, bool],
) -> None:
    where, _ = small_fs
    free = free_bytes_at(str(where))
    tier = LmdbTier(LmdbTierConfig(path=str(where / "l3"), capacity_bytes=1 << 30))
    try:
        # ext4 keeps what a failed fallocate took: asking for the capacity would have left the disk full.
        assert free_bytes_at(str(where)) >= free // 4, (free, free_bytes_at(str(where)))
        assert tier.usage().capacity_bytes <= free * 3 // 4
        for i in range(8):
            _put(tier, i)
        assert all(_read(tier, i) for i in range(8))
    finally:
        tier.close()


def test_a_disk_with_no_useful_room_is_refused_naming_the_option(tmp_path: Path) -> None:
    with mount_tmpfs(tmp_path / "fs", 1 << 20) as where:
        with pytest.raises(InvalidArgumentError, match="--l3-bytes") as info:
            LmdbTier(LmdbTierConfig(path=str(where / "l3"), capacity_bytes=64 << 20))
        assert info.value.field == "capacity_bytes"


def _l3_stats(stub: pb_grpc.KVCacheServiceStub) -> pb.TierStats:
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    return next(t for t in stats.tiers if t.tier == pb.TIER_L3)


def _wait_l3_chunks(stub: pb_grpc.KVCacheServiceStub, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _l3_stats(stub).chunks < n:
        assert time.monotonic() < deadline, f"L3 never held {n} chunks"
        threading.Event().wait(0.05)  # the write-down runs on the daemon's thread: poll its stats


def test_the_daemon_on_a_full_l3_disk_stays_up_counts_drops_and_serves_every_tier(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with mount_tmpfs(tmp_path / "fs", FS_BYTES) as where:
        # LRU order: the latest chunk stays in L2 (the adaptive default may evict a never-read one first)
        d = start_daemon(
            "--l2-bytes", "512K", "--l3-bytes", "1G", "--eviction-policy", "lru", l3=where / "l3"
        )
        try:
            stub = d.stub()
            reg = register(stub)
            early = make_keys(8, seed=81)
            early_bytes = [payload(i, 81) for i in range(8)]
            for i, key in enumerate(early):
                assert shm_store(stub, reg, [key], [early_bytes[i]]) == 1
            _wait_l3_chunks(stub, len(early))  # written down before the disk fills
            fill(where)
            late = make_keys(24, seed=82)
            for i, key in enumerate(late):  # stores land in L2; their write-downs into L3 fail
                assert shm_store(stub, reg, [key], [payload(i, 82)]) == 1
            deadline = time.monotonic() + 30.0
            while _l3_stats(stub).dropped_chunks == 0 and time.monotonic() < deadline:
                threading.Event().wait(0.05)
            assert _l3_stats(stub).dropped_chunks > 0, "no write-down failed: the disk never filled"
            got = shm_load(stub, reg, early[:1])  # an early chunk, evicted from L2 long ago: from L3
            assert got == early_bytes[:1]
            assert shm_load(stub, reg, late[-1:]) == [payload(23, 82)]  # the latest: from L2
            assert d.proc.poll() is None, "the daemon died"
        finally:
            code = d.terminate()
        assert code == 0, d.stderr()[-4000:]
        assert "SIGBUS" not in d.stderr() and "Fatal Python error" not in d.stderr()

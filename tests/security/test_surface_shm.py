"""Shared memory an engine holds cannot take the daemon down: sealed pools, on a real daemon process.

A tenant's engine receives its pool as a memfd descriptor. Today's attack: ``ftruncate`` the pool to 0 (or
past its size), then BeginStore: the daemon's own mapping lies past the end of the file and it dies of
SIGBUS. Every descriptor the daemon hands out must carry the seals that make its size fixed, the resize
must fail, and whatever the engine then does with the bytes it can reach (garbage, holes punched with
MADV_REMOVE) must leave the daemon serving: a store commits, a load answers.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import (
    DAEMON_ARGS,
    RPC_TIMEOUT_S,
    TENANT_B,
    DaemonProc,
    make_keys,
    register,
    write_tokens,
)
from tiercache.fdpass import request_segment
from tiercache.proto import tiercache_pb2 as pb
from tiercache.testing.plugin import make_daemon

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    tokens = write_tokens(tmp_path / "tokens.toml")
    d = make_daemon(tmp_path, [*DAEMON_ARGS, "--tokens-file", str(tokens)])
    try:
        yield d.start()
    finally:
        d.cleanup()


def _pool(daemon: DaemonProc) -> tuple[pb.RegisterResponse, int]:
    reg = register(daemon.stub(), TENANT_B)
    dp = reg.data_plane
    _, fd = request_segment(dp.fd_socket, "token-of-b", bytes(dp.fd_grant), RPC_TIMEOUT_S)
    return reg, fd


def _store(daemon: DaemonProc, reg: pb.RegisterResponse, fd: int, seed: int, fill: bytes) -> int:
    """BeginStore, write ``fill`` into every slot given (through a fresh mapping), CommitStore."""
    stub = daemon.stub()
    keys = make_keys(4, seed=seed)
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=TENANT_B
    )
    size = os.fstat(fd).st_size
    if size:
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED) as mem:
            sb = reg.data_plane.slot_bytes
            for ref in begin.slots:
                if (ref.slot + 1) * sb <= size:
                    mem[ref.slot * sb : ref.slot * sb + ref.nbytes] = (fill * ref.nbytes)[: ref.nbytes]
    commit = pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id)
    return int(stub.CommitStore(commit, timeout=RPC_TIMEOUT_S, metadata=TENANT_B).stored)


def test_pool_descriptor_is_sealed_and_cannot_be_resized(daemon: DaemonProc) -> None:
    _, fd = _pool(daemon)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        size = os.fstat(fd).st_size
        for attack in (0, size // 2, size * 2):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, attack)
        with pytest.raises(PermissionError):  # F_SEAL_SEAL: the seals cannot be lifted or changed
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        assert os.fstat(fd).st_size == size
    finally:
        os.close(fd)


@pytest.mark.parametrize("new_size", ["zero", "double"])
def test_truncating_the_pool_then_storing_leaves_the_daemon_up(daemon: DaemonProc, new_size: str) -> None:
    reg, fd = _pool(daemon)
    try:
        size = os.fstat(fd).st_size
        with contextlib.suppress(PermissionError):  # today it succeeds, and the daemon's next touch: SIGBUS
            os.ftruncate(fd, 0 if new_size == "zero" else size * 2)
        with contextlib.suppress(Exception):  # an error answer is fine; a dead daemon is not
            _store(daemon, reg, fd, seed=31, fill=b"\x5a")
        assert daemon.alive, f"the daemon died (exit {daemon.proc.poll() if daemon.proc else None})"
        assert os.fstat(fd).st_size == size
        assert _store(daemon, reg, fd, seed=32, fill=b"\x11") == 4
        assert (
            daemon.stub()
            .Lookup(
                pb.LookupRequest(handle=reg.handle, keys=make_keys(4, seed=32)),
                timeout=RPC_TIMEOUT_S,
                metadata=TENANT_B,
            )
            .chunks
            == 4
        )
    finally:
        os.close(fd)


def test_any_bytes_and_holes_in_the_pool_leave_the_daemon_up(daemon: DaemonProc) -> None:
    reg, fd = _pool(daemon)
    stub = daemon.stub()
    try:
        assert _store(daemon, reg, fd, seed=41, fill=b"\x00") == 4
        size = os.fstat(fd).st_size
        with mmap.mmap(fd, size, flags=mmap.MAP_SHARED) as mem:
            mem[:] = b"\xff" * size  # garbage over every slot, the stored chunks' included
            mem.madvise(mmap.MADV_REMOVE, 0, size)  # then punch the whole pool out
        assert _store(daemon, reg, fd, seed=42, fill=b"\xa5") == 4
        acq = stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=reg.handle, keys=make_keys(4, seed=41)),
            timeout=RPC_TIMEOUT_S,
            metadata=TENANT_B,
        )
        if acq.lease_id:
            stub.ReleaseLoad(
                pb.ReleaseLoadRequest(handle=reg.handle, lease_id=acq.lease_id),
                timeout=RPC_TIMEOUT_S,
                metadata=TENANT_B,
            )
        assert daemon.alive
    finally:
        os.close(fd)

"""An engine process of one tenant, run under its own uid by tests/tenants (no torch: grpc + mmap only).

Reads its job and answers with one message (the line protocol of :mod:`tiercache.testing.engine`: the job
on stdin): what it stored or loaded (sha256 of each chunk), or, for ``attack``, the outcome of every route it
tried towards another tenant's chunks.

Job fields: ``socket`` (the daemon's unix socket), ``token``, ``register`` (a serialized RegisterRequest,
hex), ``keys`` (hex), ``action`` (``store`` | ``load`` | ``attack``); ``store``: ``chunks_file`` (the
chunks, concatenated); ``attack``: ``victim_handle``, ``victim_grant``, ``victim_segment``,
``victim_sha256`` (the victim's chunk digests), ``daemon_pid``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any

import grpc

from tiercache.fdpass import request_segment
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.testing.engine import read_params, say

TIMEOUT_S = 30.0


def _map(fd: int) -> mmap.mmap:
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)


def _digests(mem: Any, slot_bytes: int, num_slots: int, chunk_bytes: int) -> set[str]:
    return {
        hashlib.sha256(mem[i * slot_bytes : i * slot_bytes + chunk_bytes]).hexdigest()
        for i in range(num_slots)
    }


def _code(call: Any) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def main() -> None:
    job = read_params()
    md = (("authorization", f"Bearer {job['token']}"),)
    keys = [bytes.fromhex(k) for k in job["keys"]]
    out: dict[str, Any] = {"uid": os.getuid()}
    with grpc.insecure_channel("unix:" + job["socket"]) as ch:
        stub = pb_grpc.KVCacheServiceStub(ch)
        reg = stub.Register(
            pb.RegisterRequest.FromString(bytes.fromhex(job["register"])), timeout=TIMEOUT_S, metadata=md
        )
        dp = reg.data_plane
        out.update(
            handle=reg.handle.hex(), segment=dp.shm_segment, grant=dp.fd_grant.hex(), fd_socket=dp.fd_socket
        )
        _, fd = request_segment(dp.fd_socket, job["token"], bytes(dp.fd_grant), TIMEOUT_S)
        mem = _map(fd)
        sb, cb = dp.slot_bytes, reg.chunk_bytes
        if job["action"] == "store":
            data = Path(job["chunks_file"]).read_bytes()
            begin = stub.BeginStore(
                pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=TIMEOUT_S, metadata=md
            )
            for ref in begin.slots:
                mem[ref.slot * sb : ref.slot * sb + ref.nbytes] = data[ref.index * cb : (ref.index + 1) * cb]
            commit = pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id)
            out["stored"] = stub.CommitStore(commit, timeout=TIMEOUT_S, metadata=md).stored
            out["skipped"] = len(begin.skipped)
        elif job["action"] == "load":
            acq = stub.AcquireLoad(
                pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=TIMEOUT_S, metadata=md
            )
            out["sha256"] = [
                hashlib.sha256(mem[r.slot * sb : r.slot * sb + r.nbytes]).hexdigest()
                for r in sorted(acq.slots, key=lambda r: r.index)
            ]
            if acq.lease_id:
                stub.ReleaseLoad(
                    pb.ReleaseLoadRequest(handle=reg.handle, lease_id=acq.lease_id),
                    timeout=TIMEOUT_S,
                    metadata=md,
                )
        else:
            out["attack"] = _attack(job, stub, md, reg, keys, mem)
        mem.close()
    say(out)


def _attack(
    job: dict[str, Any], stub: Any, md: Any, reg: pb.RegisterResponse, keys: list[bytes], mem: mmap.mmap
) -> dict[str, Any]:
    """Every route towards the victim's chunks; each entry says what happened."""
    dp = reg.data_plane
    victim = set(job["victim_sha256"])
    found: dict[str, Any] = {}
    # 1. Its own data plane: the pool it was handed holds none of the victim's bytes.
    found["own_pool_has_victim_bytes"] = bool(
        victim & _digests(mem, dp.slot_bytes, dp.num_slots, reg.chunk_bytes)
    )
    found["own_segment_is_victims"] = dp.shm_segment == job["victim_segment"]
    # 2. The same namespace and keys under its own token: a miss, nothing leased.
    found["lookup_chunks"] = stub.Lookup(
        pb.LookupRequest(handle=reg.handle, keys=keys), timeout=TIMEOUT_S, metadata=md
    ).chunks
    acq = stub.AcquireLoad(
        pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=TIMEOUT_S, metadata=md
    )
    found["own_load_slots"] = len(acq.slots)
    # 3. The victim's handle on every RPC that takes one.
    h = bytes.fromhex(job["victim_handle"])
    calls = {
        "Lookup": lambda: stub.Lookup(pb.LookupRequest(handle=h, keys=keys), timeout=TIMEOUT_S, metadata=md),
        "AcquireLoad": lambda: stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=h, keys=keys), timeout=TIMEOUT_S, metadata=md
        ),
        "BeginStore": lambda: stub.BeginStore(
            pb.BeginStoreRequest(handle=h, keys=keys), timeout=TIMEOUT_S, metadata=md
        ),
        "CommitStore": lambda: stub.CommitStore(
            pb.CommitStoreRequest(handle=h, ticket_id=2), timeout=TIMEOUT_S, metadata=md
        ),
        "Pin": lambda: stub.Pin(pb.PinRequest(handle=h), timeout=TIMEOUT_S, metadata=md),
        "Purge": lambda: stub.Purge(pb.PurgeRequest(handle=h), timeout=TIMEOUT_S, metadata=md),
        "StreamLoad": lambda: list(
            stub.StreamLoad(pb.StreamLoadRequest(handle=h, keys=keys), timeout=TIMEOUT_S, metadata=md)
        ),
    }
    found["victim_handle_codes"] = {name: _code(call) for name, call in calls.items()}
    # 4. The fd socket: the victim's (spent) grant, with its own token; then a forged one.
    fd_routes = {}
    for name, grant in (
        ("victim_grant", bytes.fromhex(job["victim_grant"])),
        ("forged_grant", os.urandom(16)),
    ):
        try:
            _, fd = request_segment(dp.fd_socket, job["token"], grant, TIMEOUT_S)
            os.close(fd)
            fd_routes[name] = "GRANTED"
        except Exception as exc:
            fd_routes[name] = type(exc).__name__
    found["fd_socket"] = fd_routes
    # 5. Names it can list or guess: /dev/shm, the daemon's open descriptors and memory.
    shm = {}
    for path in sorted(Path("/dev/shm").iterdir()):
        try:
            with open(path, "rb") as f:
                shm[path.name] = (
                    "OPENED"
                    if not victim & {hashlib.sha256(f.read(reg.chunk_bytes)).hexdigest()}
                    else "VICTIM"
                )
        except OSError as exc:
            shm[path.name] = type(exc).__name__
    found["dev_shm"] = shm
    proc = {}
    pid = job["daemon_pid"]
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fd_dir.iterdir())
        proc["fd_dir"] = f"LISTED {len(entries)}"
        for entry in entries:
            try:
                with open(entry, "rb"):
                    proc["fd_open"] = "OPENED"
                    break
            except OSError as exc:
                proc["fd_open"] = type(exc).__name__
    except OSError as exc:
        proc["fd_dir"] = type(exc).__name__
    try:
        with open(f"/proc/{pid}/mem", "rb"):
            proc["mem"] = "OPENED"
    except OSError as exc:
        proc["mem"] = type(exc).__name__
    found["proc"] = proc
    # 6. Write garbage over its whole pool (a tenant may damage only its own chunks).
    mem[:] = b"\xaa" * len(mem)
    return found


if __name__ == "__main__":
    main()

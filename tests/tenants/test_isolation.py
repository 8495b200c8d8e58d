"""The isolated data plane: two tenants' engines, each mapping only its own L2 pool, on a real daemon.

Tenant A's engine stores chunks through shared memory; tenant B's engine, with its own valid token, tries
every route to A's bytes (its own data plane, the very same namespace and keys, A's handle on every RPC,
A's grant and forged ones on the fd socket, whatever it can list or open under ``/dev/shm`` and
``/proc/<daemon>``) and fails each time, then scribbles over its whole pool; A's load stays bit-exact.
Identical chunks of the two tenants are stored twice.

The engines run as separate processes (tests/tenants/engine_child.py: grpc and mmap, no torch). As root
(CI) they run under two distinct uids that are neither the daemon's nor each other's (bare numeric uids
through ``setpriv``: no user accounts are created), with an interpreter
and packages they can read (the system python of the same version, and a world-readable copy of grpc,
protobuf and tiercache made once per session); otherwise they run as this user (then the /proc routes are
not asserted: the daemon's own user is trusted).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import tiercache
from tests.daemon.conftest import DAEMON_ARGS, DaemonProc, make_keys, namespace_spec, payload
from tiercache.proto import tiercache_pb2 as pb
from tiercache.testing.engine import EngineProcess
from tiercache.testing.plugin import make_daemon

CHILD = Path(__file__).with_name("engine_child.py")
UID_A, UID_B = 61_001, 61_002
TOKEN_A, TOKEN_B = "token-of-a-" + secrets.token_hex(8), "token-of-b-" + secrets.token_hex(8)


@dataclass(frozen=True)
class Engines:
    """How to start a tenant's engine process: the interpreter, its environment, and per-tenant uids."""

    python: str
    env: dict[str, str]
    uids: tuple[int | None, int | None]
    shared: Path

    @property
    def cross_uid(self) -> bool:
        return self.uids[0] is not None


def _system_python() -> str | None:
    """A python of this version that any uid can run (the CI venv lives under a 0700 home)."""
    candidate = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    return candidate if os.access(candidate, os.X_OK) else None


@pytest.fixture(scope="session")
def engines() -> Iterator[Engines]:
    shared = Path(tempfile.mkdtemp(prefix="tiercache-tenants-"))
    shared.chmod(0o755)
    python = _system_python()
    try:
        if os.geteuid() != 0 or python is None or shutil.which("setpriv") is None:
            yield Engines(sys.executable, dict(os.environ), (None, None), shared)
            return
        site = shared / "site"
        site.mkdir()
        import google.protobuf
        import typing_extensions

        for src in (
            Path(grpc.__file__ or "").parent,
            Path(google.protobuf.__file__ or "").parents[1],  # google/ (protobuf and its _upb extension)
            Path(tiercache.__file__ or "").parent,
        ):
            shutil.copytree(src, site / src.name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(typing_extensions.__file__ or "", site)
        for path in site.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
        yield Engines(python, env, (UID_A, UID_B), shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def daemon(engines: Engines, tmp_path: Path) -> Iterator[DaemonProc]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{TOKEN_A}" = "team-a"\n"{TOKEN_B}" = "team-b"\n')
    tokens.chmod(0o600)
    sock = engines.shared / f"d-{secrets.token_hex(3)}.sock"
    prefix = f"tiercache-test-{secrets.token_hex(4)}"
    d = make_daemon(
        tmp_path,
        [*DAEMON_ARGS, "--socket-mode", "0666", "--tokens-file", str(tokens)],
        socket=sock,
        prefix=prefix,
    )
    try:
        yield d.start()
    finally:
        d.cleanup()


def _run(engines: Engines, uid: int | None, job: dict[str, Any]) -> dict[str, Any]:
    """Run one engine job as ``uid`` (None: this user); returns its answer (the job goes on its stdin)."""
    cmd = [engines.python, str(CHILD)]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    engine = EngineProcess(cmd, job, env=engines.env)
    try:
        return engine.result(120.0)
    finally:
        engine.close()


def test_tenant_b_cannot_reach_tenant_a_chunks_by_any_route(engines: Engines, daemon: DaemonProc) -> None:
    keys = make_keys(3, seed=777)
    chunks = [payload(i, seed=777) for i in range(3)]
    digests = [hashlib.sha256(c).hexdigest() for c in chunks]
    files = {}
    for tenant, uid in zip("ab", engines.uids):  # each engine reads its own copy
        files[tenant] = engines.shared / f"{tenant}-chunks.bin"
        files[tenant].write_bytes(b"".join(chunks))
        files[tenant].chmod(0o600)
        if uid is not None:
            os.chown(files[tenant], uid, uid)
    register = pb.RegisterRequest(namespace=namespace_spec(), engine_id="engine").SerializeToString().hex()
    base = {"socket": str(daemon.socket), "register": register, "keys": [k.hex() for k in keys]}
    uid_a, uid_b = engines.uids

    a = _run(engines, uid_a, {**base, "token": TOKEN_A, "action": "store", "chunks_file": str(files["a"])})
    assert a["stored"] == 3
    assert a["segment"].startswith("memfd:") and a["fd_socket"] == f"{daemon.socket}.fd"
    if engines.cross_uid:
        assert a["uid"] == UID_A

    b = _run(
        engines,
        uid_b,
        {
            **base,
            "token": TOKEN_B,
            "action": "attack",
            "victim_handle": a["handle"],
            "victim_grant": a["grant"],
            "victim_segment": a["segment"],
            "victim_sha256": digests,
            "daemon_pid": daemon.proc.pid,
        },
    )
    attack = b["attack"]
    assert b["handle"] != a["handle"] and b["segment"] != a["segment"]
    assert attack["own_pool_has_victim_bytes"] is False and attack["own_segment_is_victims"] is False
    assert attack["lookup_chunks"] == 0 and attack["own_load_slots"] == 0
    assert attack["victim_handle_codes"] == dict.fromkeys(attack["victim_handle_codes"], "NOT_FOUND")
    assert len(attack["victim_handle_codes"]) == 7
    assert attack["fd_socket"] == {
        "victim_grant": "PermissionDeniedError",
        "forged_grant": "PermissionDeniedError",
    }
    assert "VICTIM" not in attack["dev_shm"].values()
    ours = {name: what for name, what in attack["dev_shm"].items() if name.startswith(daemon.prefix)}
    assert len(ours) == 1  # only the default pool has a name; tenant pools have none
    if engines.cross_uid:
        assert b["uid"] == UID_B
        assert set(ours.values()) == {"PermissionError"}
        assert attack["proc"]["mem"] == "PermissionError"
        assert attack["proc"].get("fd_open", "PermissionError") == "PermissionError"
        assert attack["proc"]["fd_dir"] == "PermissionError" or "fd_open" in attack["proc"]

    again = _run(engines, uid_a, {**base, "token": TOKEN_A, "action": "load"})
    assert again["sha256"] == digests  # bit-exact after B's scribbling
    twice = _run(
        engines, uid_b, {**base, "token": TOKEN_B, "action": "store", "chunks_file": str(files["b"])}
    )
    assert twice["stored"] == 3 and twice["skipped"] == 0  # a tenant boundary is a hard wall: stored twice
    assert _run(engines, uid_a, {**base, "token": TOKEN_A, "action": "load"})["sha256"] == digests

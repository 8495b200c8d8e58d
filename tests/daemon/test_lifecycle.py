"""Process lifecycle: SIGTERM drains and cleans up (exit 0, socket and shared memory gone), a restart reuses
L3, a second daemon on a live socket is refused, a stale socket file is replaced."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    StartDaemon,
    base_args,
    make_keys,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.proto import tiercache_pb2 as pb


def by_tier(reply: pb.LookupResponse) -> dict[int, int]:
    return {t.tier: t.chunks for t in reply.by_tier}


def test_sigterm_cleans_up_and_a_restart_serves_from_l3(start_daemon: StartDaemon) -> None:
    first = start_daemon()
    stub = first.stub()
    reg = register(stub)
    keys = make_keys(3, seed=70)
    chunks = [payload(i, seed=70) for i in range(3)]
    assert shm_store(stub, reg, keys, chunks) == 3
    segments = first.segments()
    assert [p.name for p in segments] == [reg.data_plane.shm_segment]

    assert first.terminate() == 0
    assert not os.path.exists(first.socket)
    assert not segments[0].exists() and first.segments() == []
    assert "tiercache-daemon listening on unix:" in first.stderr()

    second = start_daemon()  # same --l3-path
    stub = second.stub()
    reg2 = register(stub)
    assert reg2.handle == reg.handle  # deterministic ids: the same handle after a restart
    assert reg2.data_plane.shm_segment != reg.data_plane.shm_segment
    found = stub.Lookup(pb.LookupRequest(handle=reg2.handle, keys=keys), timeout=RPC_TIMEOUT_S)
    assert found.chunks == 3 and by_tier(found) == {pb.TIER_L1: 0, pb.TIER_L2: 0, pb.TIER_L3: 3}
    ready = stub.Prefetch(
        pb.PrefetchRequest(handle=reg2.handle, keys=keys[:1], timeout_s=10), timeout=RPC_TIMEOUT_S
    )
    assert ready.ready == 1
    assert shm_load(stub, reg2, keys) == chunks  # promoted from L3 into L2, bit-exact
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert stats.tiers[1].promotions == 3


def test_sigint_also_exits_cleanly(start_daemon: StartDaemon) -> None:
    d = start_daemon()
    d.proc.send_signal(signal.SIGINT)
    assert d.proc.wait(timeout=30) == 0
    assert not os.path.exists(d.socket) and d.segments() == []


def test_a_second_daemon_on_a_live_socket_is_refused(start_daemon: StartDaemon, tmp_path: Path) -> None:
    first = start_daemon()
    args = base_args(tmp_path, "tiercache-test-second", tmp_path / "l3-second")
    out = subprocess.run(
        [sys.executable, "-m", "tiercache.daemon", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert f"another daemon is listening on {first.socket}" in out.stderr
    assert not list(Path("/dev/shm").glob("tiercache-test-second.*"))
    reply = first.stub().Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)  # the first one still serves
    assert len(reply.tiers) == 3


def test_a_stale_socket_file_is_replaced(start_daemon: StartDaemon, tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "d.sock"))
    stale.close()  # the file stays, nobody listens: what a killed daemon leaves behind
    assert (tmp_path / "d.sock").exists()
    d = start_daemon()
    assert "removing stale socket file" in d.stderr()
    assert len(d.stub().Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).tiers) == 3


def test_sigterm_ends_open_event_streams_cleanly(start_daemon: StartDaemon) -> None:
    d = start_daemon()
    stub = d.stub()
    call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=0), timeout=60)
    call.initial_metadata()  # the subscription is live
    d.proc.send_signal(signal.SIGTERM)
    assert list(call) == []  # replay was empty; the stream ends when the daemon drains
    assert call.code() == grpc.StatusCode.OK
    assert d.proc.wait(timeout=30) == 0

"""The control socket of a real daemon: the same unary calls as over gRPC, with the same answers, tenants,
tokens and statuses; bad frames get a status (or a closed connection) and the daemon carries on."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.daemon.conftest import (
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
    DaemonProc,
    StartDaemon,
    make_keys,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.connector import rpcs
from tiercache.connector.control import ControlCallError, ControlSocket
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.wire.control import ANSWER, CALL, HELLO, call_frame, hello_frame, read_exactly

UNARY = {rpc.name: rpc for rpc in rpcs.ALL if isinstance(rpc, rpcs.UnaryRpc)}


class ControlStub:
    """The service's unary calls, called as on the generated stub, through the daemon's control socket (one
    :class:`ControlSocket` per token)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._sockets: dict[str | None, ControlSocket] = {}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        rpc = UNARY[name]

        def call(request: Any, timeout: float, metadata: Sequence[tuple[str, str]] = ()) -> Any:
            token = next((v.removeprefix("Bearer ") for k, v in metadata if k == "authorization"), None)
            sock = self._sockets.setdefault(token, ControlSocket(self._path, token))
            return sock.call(rpc, request, timeout)

        return call

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()


def _fails(call: Callable[[], object], code: grpc.StatusCode, fragment: str) -> None:
    with pytest.raises(ControlCallError) as info:
        call()
    assert info.value.code() == code, (info.value.code(), info.value.details())
    assert fragment in info.value.details()


def _raw(path: str, token: str | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(RPC_TIMEOUT_S)
    sock.connect(path)
    sock.sendall(hello_frame(token))
    return sock


def _answer(sock: socket.socket) -> tuple[grpc.StatusCode, bytes]:
    size, code = ANSWER.unpack(read_exactly(sock, ANSWER.size))
    body = read_exactly(sock, size)
    return next(c for c in grpc.StatusCode if c.value[0] == code), body


def _closed(sock: socket.socket) -> bool:
    return sock.recv(1) == b""


def test_stores_and_loads_over_the_control_socket_match_grpc_and_keep_tenants_apart(
    tenants_daemon: DaemonProc,
) -> None:
    stub = tenants_daemon.stub()
    reg_a = register(stub, TENANT_A)
    path = f"{tenants_daemon.socket}.ctl"
    assert reg_a.control_socket == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    control = ControlStub(path)
    try:
        keys = make_keys(3, seed=91)
        chunks = [payload(i, seed=91) for i in range(3)]
        assert shm_store(control, reg_a, keys, chunks, TENANT_A) == 3  # BeginStore + CommitStore
        assert shm_load(control, reg_a, keys, TENANT_A) == chunks  # AcquireLoad + ReleaseLoad, bit-exact
        for via in (stub, control):  # the same answer either way
            found = via.Lookup(pb.LookupRequest(handle=reg_a.handle, keys=keys), RPC_TIMEOUT_S, TENANT_A)
            assert found.chunks == 3
        reg_b = register(stub, TENANT_B)
        miss = control.Lookup(pb.LookupRequest(handle=reg_b.handle, keys=keys), RPC_TIMEOUT_S, TENANT_B)
        assert miss.chunks == 0  # tenant B does not see A's chunks
        request = pb.LookupRequest(handle=reg_a.handle, keys=keys)
        _fails(lambda: control.Lookup(request, RPC_TIMEOUT_S, TENANT_B), grpc.StatusCode.NOT_FOUND, "")
        _fails(
            lambda: control.Lookup(request, RPC_TIMEOUT_S), grpc.StatusCode.UNAUTHENTICATED, "authorization"
        )
        wrong = (("authorization", "Bearer not-a-token"),)
        _fails(lambda: control.Lookup(request, RPC_TIMEOUT_S, wrong), grpc.StatusCode.UNAUTHENTICATED, "")
        bad = pb.LookupRequest(handle=reg_a.handle, keys=[b"short"])
        _fails(lambda: control.Lookup(bad, RPC_TIMEOUT_S, TENANT_A), grpc.StatusCode.INVALID_ARGUMENT, "keys")
    finally:
        control.close()
    assert f"control socket: engine pid={os.getpid()} " in tenants_daemon.stderr()


def test_bad_frames_get_a_status_or_a_closed_connection_and_the_daemon_carries_on(
    tenants_daemon: DaemonProc,
) -> None:
    path = f"{tenants_daemon.socket}.ctl"
    token = TENANT_A[0][1].removeprefix("Bearer ")
    with _raw(path, token) as sock:
        sock.sendall(call_frame("Lookup", b"\xff\xff\xff"))  # not a LookupRequest
        code, body = _answer(sock)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and b"Lookup" in body
        sock.sendall(call_frame("Nope", b""))
        code, body = _answer(sock)
        assert code == grpc.StatusCode.UNIMPLEMENTED and b"Nope" in body
        sock.sendall(call_frame("StreamLoad", b""))  # streams stay on gRPC
        assert _answer(sock)[0] == grpc.StatusCode.UNIMPLEMENTED
        sock.sendall(call_frame("Echo", pb.EchoMessage(data=b"ok").SerializeToString()))
        code, body = _answer(sock)  # the connection still serves after refused calls
        assert code == grpc.StatusCode.OK and pb.EchoMessage.FromString(body).data == b"ok"
    with _raw(path, token) as sock:
        sock.sendall(CALL.pack(1 << 30, 4) + b"Echo")  # over the message limit: refused, closed
        code, body = _answer(sock)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and b"request" in body
        assert _closed(sock)
    with _raw(path, token) as sock:
        sock.sendall(CALL.pack(0, 0))  # no method name
        assert _answer(sock)[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert _closed(sock)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(RPC_TIMEOUT_S)
        sock.connect(path)
        sock.sendall(HELLO.pack(3, 7) + b"abc")  # not a hello
        assert _closed(sock)
    diag = pb_grpc.DiagnosticsStub(tenants_daemon.channel())
    assert diag.Echo(pb.EchoMessage(data=b"up"), timeout=RPC_TIMEOUT_S, metadata=TENANT_A).data == b"up"
    control = ControlStub(path)
    try:
        assert control.Stats(pb.StatsRequest(), RPC_TIMEOUT_S, TENANT_A) is not None
    finally:
        control.close()


def test_the_option_turns_it_off_and_a_stop_removes_it(start_daemon: StartDaemon, tmp_path: Path) -> None:
    off = start_daemon("--no-control-socket")
    assert register(off.stub()).control_socket == ""
    assert not os.path.exists(f"{off.socket}.ctl")
    assert off.terminate() == 0
    on = start_daemon(l3=tmp_path / "l3-on")
    path = register(on.stub()).control_socket
    assert path == f"{on.socket}.ctl"
    idle = ControlSocket(path, None)
    assert idle.call(rpcs.STATS, pb.StatsRequest(), RPC_TIMEOUT_S) is not None  # one idle connection held
    assert on.terminate() == 0  # the idle connection does not hold the drain up
    assert not os.path.exists(path)
    _fails(lambda: idle.call(rpcs.STATS, pb.StatsRequest(), RPC_TIMEOUT_S), grpc.StatusCode.UNAVAILABLE, path)
    idle.close()

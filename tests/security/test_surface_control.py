"""The control socket checks a connection's token before it keeps anything else the connection sends.

Today's attack: a peer with no token (or a wrong one) sends a hello, then a call frame that announces a
request of ``max_message_bytes`` and sends it slowly; the daemon buffers it all before the call's handler
finds the token missing. Many such connections hold that much memory each. Here the daemon must answer
UNAUTHENTICATED right after the hello, before any call frame, keep none of what follows, and close the
connection; a tenant's own connection keeps working.
"""

from __future__ import annotations

import socket

import grpc
import pytest

from tests.daemon.conftest import TENANT_A, DaemonProc, make_keys, register
from tests.daemon.conftest import tenants_daemon as tenants_daemon  # the fixture: two tenants' tokens
from tiercache.connector.control import ControlSocket
from tiercache.connector.rpcs import LOOKUP
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire.control import ANSWER, CALL, hello_frame, read_exactly

WAIT_S = 10.0


def _hello(path: str, token: str | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.connect(path)
    sock.sendall(hello_frame(token))
    return sock


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_no_valid_token_is_refused_at_the_hello(tenants_daemon: DaemonProc, token: str | None) -> None:
    path = f"{tenants_daemon.socket}.ctl"
    with _hello(path, token) as sock:
        size, code = ANSWER.unpack(read_exactly(sock, ANSWER.size))  # before any call frame is sent
        assert code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert b"authorization" in read_exactly(sock, size)
        big = 200 << 10  # a call that announces most of the daemon's message limit (256 KiB here)
        sent = 0
        with pytest.raises(OSError):  # the daemon keeps none of it and closes the connection
            sock.sendall(CALL.pack(big, 6) + b"Lookup")
            while sent < big:
                sent += sock.send(b"\0" * 4096)
            while sock.recv(4096):
                pass
            raise ConnectionResetError("closed by the daemon")
    assert "AUDIT control socket refused" in tenants_daemon.stderr()


def test_a_tenants_connection_still_works(tenants_daemon: DaemonProc) -> None:
    path = f"{tenants_daemon.socket}.ctl"
    reg = register(tenants_daemon.stub(), TENANT_A)
    control = ControlSocket(path, TENANT_A[0][1].removeprefix("Bearer "))
    try:
        found = control.call(LOOKUP, pb.LookupRequest(handle=reg.handle, keys=make_keys(2, seed=5)), WAIT_S)
        assert found.chunks == 0
    finally:
        control.close()

"""The ``.fd`` listener serves every connection at once, with one deadline per whole request.

Today's attack: the listener answers one connection at a time with a 5 s timeout per ``recv``; a peer with
no token that sends one byte every second (or every 4 s) holds it forever, and every tenant's engine fails
to get its pool (and falls back to the byte stream). Here a crowd of such tricklers is connected while a
tenant redeems its grant: the grant is answered, and each trickler is closed once the request deadline has
passed, however it keeps trickling.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DAEMON_ARGS, TENANT_A, DaemonProc, register, write_tokens
from tiercache.fdpass import request_segment
from tiercache.testing.plugin import make_daemon

TRICKLERS = 20
GRANT_TIMEOUT_S = 30.0
"""How long the tenant's request may take: far beyond an answer's, far below a trickler's lifetime today."""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    tokens = write_tokens(tmp_path / "tokens.toml")
    d = make_daemon(tmp_path, [*DAEMON_ARGS, "--tokens-file", str(tokens)])
    try:
        yield d.start()
    finally:
        d.cleanup()


class Trickler:
    """A connection to the fd socket that sends one byte of a request every ``every_s`` seconds."""

    def __init__(self, path: str, every_s: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.closed_by_daemon = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        try:
            while not self._stop.wait(every_s):
                self.sock.send(b"{")
        except OSError:  # the daemon closed it: EPIPE / ECONNRESET
            self.closed_by_daemon.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_trickling_connections_do_not_block_a_tenants_grant(daemon: DaemonProc) -> None:
    path = f"{daemon.socket}.fd"
    tricklers = [Trickler(path, every_s=1.0) for _ in range(TRICKLERS)]
    try:
        for t in tricklers:
            t.sock.send(b'{"token": "')  # a request begun: today the listener now waits on the first one
        reg = register(daemon.stub(), TENANT_A)
        name, fd = request_segment(
            reg.data_plane.fd_socket, "token-of-a", bytes(reg.data_plane.fd_grant), GRANT_TIMEOUT_S
        )
        os.close(fd)
        assert name == reg.data_plane.shm_segment
        for t in tricklers:  # the deadline is per whole request (5 s), not per recv
            assert t.closed_by_daemon.wait(GRANT_TIMEOUT_S)
        assert daemon.alive
    finally:
        for t in tricklers:
            t.close()

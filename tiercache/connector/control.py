"""The control socket, engine side: the daemon's unary calls over a plain unix socket instead of gRPC.

An engine's calls come between model steps; through gRPC each then costs ~1.5-2 ms (its threads have gone
idle), over the daemon's control socket ~0.4-0.8 ms (framing and the reason: :mod:`tiercache.wire.control`).
The daemon names the socket in its RegisterResponse; :class:`~.connection.Connection` then sends every
unary call here and keeps gRPC for Register, the byte streams and calls it does not wait for.

Calls are blocking and thread-safe: each takes an idle connection from a small pool (or opens one, sending
the hello with the token) and gives it back after the answer, so concurrent calls never queue behind one
another, and a forked child never uses its parent's connections. A call that fails on the socket —
refused, reset, closed, timed out — closes its connection and raises :class:`ControlCallError` with the
status gRPC would give (UNAVAILABLE, DEADLINE_EXCEEDED), so that the connection's error mapping, backoff
and re-registration apply unchanged. A socket that cannot be connected to at all
(:class:`ControlUnreachable`: nothing was sent) makes the connection go back to gRPC.

Primitives:
    ControlCallError: a failed call's status code and details (a ``grpc.RpcError``).
    ControlUnreachable: the socket could not be connected to; the call was not sent.
    ControlSocket: ``call(rpc, request, timeout_s)``, ``close``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import grpc

from tiercache.wire.control import ANSWER, call_frame, hello_frame, read_exactly

from .rpcs import Req, Resp, UnaryRpc

logger = logging.getLogger(__name__)

_IDLE_KEPT = 8
"""Idle connections kept for reuse; more concurrent calls open more, and close them after."""
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]


class ControlCallError(grpc.RpcError):  # type: ignore[misc]  # grpc has no type stubs: RpcError is Any
    """A control-socket call that did not succeed: the status the daemon answered, or the socket's failure
    as the status gRPC would report (``code()`` and ``details()`` as on a failed gRPC call)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        """Args: the status code and its details."""
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        """The status code."""
        return self._code

    def details(self) -> str:
        """The status details."""
        return self._details


class ControlUnreachable(ControlCallError):
    """The control socket could not be connected to: the call was not sent (it may go through gRPC)."""


class ControlSocket:
    """The daemon's control socket at ``path``. Thread-safe."""

    def __init__(self, path: str, token: str | None) -> None:
        """Args: path: the socket the daemon named; token: the bearer token (None: none). Connects lazily."""
        self.path = path
        self._hello = hello_frame(token)
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._pid = os.getpid()
        self._closed = False

    def call(self, rpc: UnaryRpc[Req, Resp], request: Req, timeout_s: float) -> Resp:
        """Call ``rpc`` with ``request`` and wait at most ``timeout_s`` for its answer.

        Raises:
            ControlUnreachable: no connection could be made (nothing was sent).
            ControlCallError: the daemon's status for a failed call; UNAVAILABLE when the connection broke;
                DEADLINE_EXCEEDED after ``timeout_s``.
        """
        frame = call_frame(rpc.name, request.SerializeToString())
        sock = self._take(timeout_s)
        try:
            sock.settimeout(timeout_s)
            sock.sendall(frame)
            size, code = ANSWER.unpack(read_exactly(sock, ANSWER.size))
            body = read_exactly(sock, size)
        except TimeoutError:
            sock.close()
            raise ControlCallError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer on {self.path} within {timeout_s:g}s"
            ) from None
        except OSError as exc:
            sock.close()
            raise ControlCallError(
                grpc.StatusCode.UNAVAILABLE, f"control socket {self.path}: {exc}"
            ) from None
        if code == _UNAUTHENTICATED:
            sock.close()  # the daemon refuses the connection's token once, at its hello, and closes it
        else:
            self._give_back(sock)
        if code != 0:
            raise ControlCallError(_CODES.get(code, grpc.StatusCode.UNKNOWN), body.decode("utf-8", "replace"))
        return rpc.response.FromString(body)

    def close(self) -> None:
        """Close every idle connection (idempotent); calls in flight close theirs when they end."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def _take(self, timeout_s: float) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ControlCallError(grpc.StatusCode.UNAVAILABLE, "the client is closed")
            if self._pid != os.getpid():  # a forked child: the parent's connections are the parent's
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                sock = self._idle.pop()
                if _alive(sock):
                    return sock
                sock.close()  # the daemon closed it (restarted, or drained)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(self.path)
            sock.sendall(self._hello)
        except OSError as exc:
            sock.close()
            raise ControlUnreachable(
                grpc.StatusCode.UNAVAILABLE, f"control socket {self.path}: {exc}"
            ) from None
        return sock

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _IDLE_KEPT:
                self._idle.append(sock)
                return
        sock.close()


def _alive(sock: socket.socket) -> bool:
    """True when an idle connection is still open and has nothing unread (else it is of no use)."""
    sock.settimeout(0.0)  # with a timeout, recv would first wait for data
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False

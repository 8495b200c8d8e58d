"""The control socket, daemon side: the service's unary calls over a plain unix socket (``<socket>.ctl``).

A same-host engine's calls come between model steps, when gRPC's threads have gone idle, and such a call
costs ~1.5-2 ms here; the same request over a unix socket answered on the event loop ~0.4-0.8 ms (framing:
:mod:`tiercache.wire.control`). Each call runs through the very handlers gRPC serves (the
:func:`~.decode.method_handlers` of the servicer: decode check, authentication of the connection's token on
every call, handle resolution, rate limits, RPC metrics, status mapping), with :class:`ControlContext`
standing in for grpc.aio's servicer context: the same request gets the same answer and the same status on
either path. Streaming methods are not served here (UNIMPLEMENTED); engines keep gRPC for them.

The socket file has the gRPC socket's mode from its bind: whoever may call the daemon over gRPC's unix socket
may call it here, nobody else. The hello's token is checked as soon as the hello is in, before any call frame
is read: a peer without a valid token gets UNAUTHENTICATED and nothing more it sends is kept (it cannot make
the daemon buffer a message of ``max_message_bytes``); the connection is closed a moment later. A frame
longer than the daemon's gRPC message limit, or malformed, is answered with a status and the connection
closed; the daemon carries on. ``SO_PEERCRED`` (the peer's pid and uid) is logged, not enforced: the socket
file's mode says who may connect, the token which tenant it is.

Primitives:
    ControlContext: a call's metadata and its abort status.
    ControlServer: ``start``, ``close(grace_s)``; ``path``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import grpc

from tiercache import fdpass
from tiercache.wire.control import CALL, HELLO, MAX_METHOD_NAME, answer_frame

from .auth import Authenticator, UnauthenticatedError
from .listen import SocketFile, bind_unix_socket

logger = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 4096
"""The longest bearer token a hello may carry."""
REFUSED_LINGER_S = 1.0
"""How long a connection refused at its hello stays open (its input dropped) so that its first call, already
on its way, reads the refusal rather than a broken pipe."""
_OK = grpc.StatusCode.OK.value[0]


class ControlContext:
    """What a handler sees of a control-socket call: the connection's metadata, and ``abort``."""

    __slots__ = ("_metadata", "code", "details")

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        """Args: metadata: the call metadata (the hello's bearer token)."""
        self._metadata = metadata
        self.code = grpc.StatusCode.UNKNOWN
        self.details = ""

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        """The call's metadata, as gRPC's context gives it."""
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code`` and ``details`` (raises ``grpc.aio.AbortError``, as grpc.aio does)."""
        self.code, self.details = code, details
        raise grpc.aio.AbortError()


class ControlServer:
    """Serves unary calls on a unix socket with the given gRPC method handlers."""

    def __init__(
        self,
        handlers: Mapping[str, Any],
        path: str,
        mode: int,
        max_message_bytes: int,
        auth: Authenticator | None = None,
    ) -> None:
        """Args:
        handlers: method name -> grpc method handler (only the unary-unary ones are served).
        path: the socket file (replaced when stale).
        mode: its permission bits.
        max_message_bytes: the longest request accepted (the gRPC limit).
        auth: checks a connection's token at its hello (None: only each call's handler checks it).
        """
        self.auth = auth
        self._handlers = {
            name: h for name, h in handlers.items() if not h.request_streaming and not h.response_streaming
        }
        self.path = path
        self._mode = mode
        self.max_message_bytes = max_message_bytes
        self._server: asyncio.AbstractServer | None = None
        self._file: SocketFile | None = None
        self._connections: set[_Connection] = set()
        self.closing = False

    async def start(self) -> None:
        """Bind and listen (replacing a stale socket file).

        Raises:
            OSError: the socket cannot be bound.
        """
        sock, self._file = bind_unix_socket(self.path, self._mode)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), sock=sock)
        logger.info("control socket: unary calls also served on %s", self.path)

    async def close(self, grace_s: float) -> None:
        """Stop accepting, let calls in flight finish for up to ``grace_s``, close every connection and
        remove the socket file (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        self.closing = True
        server.close()
        calls = {c.call for c in self._connections if c.call is not None}
        for connection in list(self._connections):
            if connection.call is None:
                connection.close()
        if calls:
            _, late = await asyncio.wait(calls, timeout=grace_s)
            for task in late:
                task.cancel()
        for connection in list(self._connections):
            connection.close()
        if self._file is not None:
            self._file.remove()

    def opened(self, connection: _Connection) -> None:
        """Track a new connection."""
        self._connections.add(connection)

    def lost(self, connection: _Connection) -> None:
        """Forget a closed connection."""
        self._connections.discard(connection)

    async def call(self, method: str, body: bytes, metadata: Sequence[tuple[str, str]]) -> tuple[int, bytes]:
        """Run one call through its gRPC handler: (status code, response or details)."""
        handler = self._handlers.get(method)
        if handler is None:
            details = f"method: {method!r} is not a unary call of the service (streams go through gRPC)"
            return grpc.StatusCode.UNIMPLEMENTED.value[0], details.encode()
        context = ControlContext(metadata)
        try:
            response = await handler.unary_unary(handler.request_deserializer(body), context)
        except grpc.aio.AbortError:
            return context.code.value[0], context.details.encode()
        except Exception:
            logger.exception("control socket: %s failed", method)
            return grpc.StatusCode.INTERNAL.value[
                0
            ], f"internal error in {method}; see the daemon log".encode()
        return _OK, handler.response_serializer(response)


class _Connection(asyncio.Protocol):
    """One engine connection: its hello, then one call at a time (reading pauses while a call runs).

    A protocol rather than asyncio streams: after an idle spell the streams' extra futures and callbacks
    cost ~0.1 ms of a ~0.3 ms round trip on these machines.
    """

    def __init__(self, server: ControlServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._transport: asyncio.Transport | None = None
        self._refused = False
        self.call: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server.opened(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            peer = fdpass.peer_credentials(sock)
            logger.info("control socket: engine pid=%d uid=%d connected", peer.pid, peer.uid)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.lost(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # refused at its hello: nothing it sends is kept
        self._buffer += data
        self._advance()

    def close(self) -> None:
        """Close the connection (a call in flight finds it closed when it answers)."""
        if self._transport is not None:
            self._transport.close()

    def _advance(self) -> None:
        """Read the hello, then start the next complete call (one at a time)."""
        buf = self._buffer
        if self.call is not None or self._transport is None:
            return
        if self._metadata is None:
            if len(buf) < HELLO.size:
                return
            size, zero = HELLO.unpack_from(buf)
            if zero != 0 or size > MAX_TOKEN_BYTES:
                logger.info(
                    "control socket: a malformed hello (%d bytes, tag %d); connection closed", size, zero
                )
                self.close()
                return
            if len(buf) < HELLO.size + size:
                return
            token = bytes(buf[HELLO.size : HELLO.size + size]).decode("utf-8", "replace")
            del buf[: HELLO.size + size]
            self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
            if not self._authenticated(self._metadata):
                return
        if len(buf) < CALL.size:
            return
        size, name_len = CALL.unpack_from(buf)
        refusal = self._refusal(size, name_len)
        if refusal is not None:
            self._transport.write(refusal)
            self.close()
            return
        end = CALL.size + name_len + size
        if len(buf) < end:
            return
        method = bytes(buf[CALL.size : CALL.size + name_len]).decode("ascii", "replace")
        body = bytes(buf[CALL.size + name_len : end])
        del buf[:end]
        self._transport.pause_reading()
        self.call = asyncio.get_running_loop().create_task(self._run(method, body, self._metadata))

    def _authenticated(self, metadata: tuple[tuple[str, str], ...]) -> bool:
        """Check the hello's token; refuse the connection (UNAUTHENTICATED, input dropped) when it fails."""
        auth = self._server.auth
        if auth is None:
            return True
        try:
            auth.identify(metadata)
        except UnauthenticatedError as exc:
            assert self._transport is not None
            sock = self._transport.get_extra_info("socket")
            peer = fdpass.peer_credentials(sock) if sock is not None else None
            logger.warning(
                "AUDIT control socket refused pid=%s uid=%s: %s",
                peer.pid if peer else "?",
                peer.uid if peer else "?",
                exc,
            )
            self._refused = True
            self._buffer.clear()
            self._transport.write(answer_frame(grpc.StatusCode.UNAUTHENTICATED.value[0], str(exc).encode()))
            asyncio.get_running_loop().call_later(REFUSED_LINGER_S, self.close)
            return False
        return True

    def _refusal(self, size: int, name_len: int) -> bytes | None:
        """The answer refusing a call frame that cannot be served (None: it can)."""
        if not 0 < name_len <= MAX_METHOD_NAME:
            details = f"method: a call must name a method of 1..{MAX_METHOD_NAME} bytes, got {name_len}"
            return answer_frame(grpc.StatusCode.INVALID_ARGUMENT.value[0], details.encode())
        limit = self._server.max_message_bytes
        if size > limit:
            details = f"request: {size} bytes is over the daemon's message limit of {limit}"
            return answer_frame(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], details.encode())
        return None

    async def _run(self, method: str, body: bytes, metadata: tuple[tuple[str, str], ...]) -> None:
        try:
            code, answer = await self._server.call(method, body, metadata)
        finally:
            self.call = None
        transport = self._transport
        if transport is None:
            return  # the engine went away
        transport.write(answer_frame(code, answer))
        if self._server.closing:
            self.close()
            return
        transport.resume_reading()
        self._advance()

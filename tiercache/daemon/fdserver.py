"""The isolated data plane, daemon side: tenant pools, one-time grants and the ``<socket>.fd`` listener.

With tokens configured, every tenant's L2 chunks live in that tenant's own anonymous segment
(:class:`~tiercache.tiers.host.HostTier` pools). Register assigns the namespace to its tenant's pool and
answers with a one-time grant; the engine redeems it on the side socket (:mod:`tiercache.fdpass`) with its
token and receives the pool's file descriptor. A grant is bound to the tenant it was issued to, spent on
first use and forgotten after :data:`GRANT_TTL_S`: a grant read off another engine's screen is worth
nothing without that tenant's token, and a token is worth nothing without a fresh grant.

The listener serves every connection at once, on its own thread (a selector over non-blocking sockets: no
polling, no thread per connection): a request is answered as soon as its whole line is in, and a connection
whose line is not complete within :data:`REQUEST_DEADLINE_S` of its accept is closed, however it trickles,
so a peer without a token cannot hold up another tenant's grant. Past :data:`MAX_PENDING` connections
waiting for their line the oldest is closed. Only a descriptor whose size is sealed
(:data:`tiercache.shm.REQUIRED_SEALS`) ever leaves: an engine cannot shrink or grow the pool it maps.

Primitives:
    GRANT_TTL_S: how long a grant can be redeemed.
    REQUEST_DEADLINE_S: how long a connection may take to send its whole request.
    MAX_PENDING: connections at most waiting for their request line.
    Grants: issue / redeem (thread-safe).
    TenantPools: the pools, the grants and the listener: start, register (on Register), close.
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from tiercache import fdpass
from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.shm import is_sealed
from tiercache.tiers.host import HostTier

from .auth import Authenticator
from .listen import SocketFile, bind_unix_socket

logger = logging.getLogger(__name__)

GRANT_TTL_S = 60.0
"""Seconds a grant from Register can be redeemed on the fd socket."""
_GRANTS_KEPT = 65_536
REQUEST_DEADLINE_S = 5.0
"""Seconds from a connection's accept until its whole request line must be in (else it is closed)."""
MAX_PENDING = 1024
"""Connections at most waiting for their request line; past it the oldest is closed."""


class Grants:
    """One-time grants: grant bytes -> (tenant, expiry). Thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Args: clock: monotonic seconds."""
        self._clock = clock
        self._lock = threading.Lock()
        self._grants: OrderedDict[bytes, tuple[str, float]] = OrderedDict()

    def issue(self, tenant: str) -> bytes:
        """A fresh grant for ``tenant`` (the oldest are forgotten beyond a bound)."""
        grant = secrets.token_bytes(16)
        with self._lock:
            self._grants[grant] = (tenant, self._clock() + GRANT_TTL_S)
            while len(self._grants) > _GRANTS_KEPT:
                self._grants.popitem(last=False)
        return grant

    def redeem(self, grant: bytes, tenant: str) -> bool:
        """Spend ``grant`` if it was issued to ``tenant`` and has not expired (a wrong tenant spends it too)."""
        with self._lock:
            held = self._grants.pop(grant, None)
        return held is not None and held[0] == tenant and self._clock() < held[1]


@dataclass(slots=True)
class _Pending:
    """A connection waiting for its request line: what came so far, and when it must be complete."""

    conn: socket.socket
    peer: fdpass.PeerCredentials
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class TenantPools:
    """Hands each tenant's engines its own L2 pool, and only theirs."""

    def __init__(self, host: HostTier, auth: Authenticator, socket_path: str, mode: int) -> None:
        """Args: the L2 tier, the authenticator of the gRPC service, the fd socket's path and file mode."""
        self._host = host
        self._auth = auth
        self.socket_path = socket_path
        self._mode = mode
        self._grants = Grants()
        self._sock: socket.socket | None = None
        self._file: SocketFile | None = None
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and listen on the fd socket (replacing a stale socket file), then serve on a thread.

        Raises:
            OSError: the socket cannot be bound.
        """
        sock, self._file = bind_unix_socket(self.socket_path, self._mode)
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="tiercache-fd", daemon=True)
        self._thread.start()
        logger.info("isolated data plane: tenant segments handed out on %s", self.socket_path)

    def register(self, handle: bytes, tenant: str) -> pb.DataPlane:
        """Put ``handle``'s chunks in ``tenant``'s pool; the data plane an engine of ``tenant`` uses."""
        self._host.assign(handle, tenant)
        segment = self._host.segment_of(tenant)
        return pb.DataPlane(
            shm_segment=segment.name,
            slot_bytes=self._host.slot_bytes,
            num_slots=self._host.num_slots,
            segment_bytes=self._host.segment_bytes,
            max_chunk_bytes=self._host.max_chunk_bytes,
            index_entries=self._host.index_entries,
            fd_socket=self.socket_path,
            fd_grant=self._grants.issue(tenant),
        )

    def close(self) -> None:
        """Stop listening, close the connections waiting and remove the socket file (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        sock.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        if self._file is not None:
            self._file.remove()

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        pending: OrderedDict[socket.socket, _Pending] = OrderedDict()  # in accept order: deadline order too
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            try:
                while True:
                    timeout = None
                    if pending:
                        timeout = max(0.0, next(iter(pending.values())).deadline - time.monotonic())
                    for key, _ in selector.select(timeout):
                        if key.fileobj == self._wake_r:
                            return
                        if key.fileobj is sock:
                            self._accept(sock, selector, pending)
                        elif isinstance(key.fileobj, socket.socket):
                            try:
                                self._receive(key.fileobj, selector, pending)
                            except Exception:  # one connection's failure never stops the listener
                                logger.exception("fd socket: a request failed")
                    now = time.monotonic()
                    while pending and next(iter(pending.values())).deadline <= now:
                        _, late = pending.popitem(last=False)
                        logger.warning(
                            "AUDIT fd refused pid=%d uid=%d: no whole request within %.0f s",
                            late.peer.pid,
                            late.peer.uid,
                            REQUEST_DEADLINE_S,
                        )
                        self._drop(late, selector)
            finally:
                for waiting in pending.values():
                    waiting.conn.close()

    def _accept(
        self,
        sock: socket.socket,
        selector: selectors.BaseSelector,
        pending: OrderedDict[socket.socket, _Pending],
    ) -> None:
        """Accept every connection waiting on the listener."""
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("fd socket: accept failed (%s)", exc)
                if pending:  # out of descriptors: make room, or the listener stays readable for nothing
                    self._drop(pending.popitem(last=False)[1], selector)
                return
            conn.setblocking(False)
            if len(pending) >= MAX_PENDING:
                _, oldest = pending.popitem(last=False)
                logger.warning(
                    "fd socket: %d connections wait for a request; closing the oldest", MAX_PENDING
                )
                self._drop(oldest, selector)
            waiting = _Pending(conn, fdpass.peer_credentials(conn), time.monotonic() + REQUEST_DEADLINE_S)
            pending[conn] = waiting
            selector.register(conn, selectors.EVENT_READ)

    def _receive(
        self,
        conn: socket.socket,
        selector: selectors.BaseSelector,
        pending: OrderedDict[socket.socket, _Pending],
    ) -> None:
        """Read what a connection sent; answer it once its line is whole (or close it)."""
        waiting = pending.get(conn)
        if waiting is None:
            return  # closed earlier in the same round of events (dropped as the oldest)
        try:
            more = conn.recv(fdpass.MAX_LINE_BYTES + 1 - len(waiting.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            more = b""
        waiting.data += more
        end = waiting.data.find(b"\n")
        if more and end < 0 and len(waiting.data) <= fdpass.MAX_LINE_BYTES:
            return
        del pending[conn]
        selector.unregister(conn)
        with conn:
            try:
                self._answer(conn, waiting.peer, bytes(waiting.data if end < 0 else waiting.data[:end]))
            except OSError as exc:
                logger.info("fd socket: a request failed (%s)", exc)

    @staticmethod
    def _drop(waiting: _Pending, selector: selectors.BaseSelector) -> None:
        selector.unregister(waiting.conn)
        waiting.conn.close()

    def _answer(self, conn: socket.socket, peer: fdpass.PeerCredentials, line: bytes) -> None:
        try:
            request = fdpass.parse_request(line)
            metadata = [("authorization", f"Bearer {request.token}")] if request.token else []
            tenant = self._auth.tenant(metadata)
        except TierCacheError as exc:
            logger.warning("AUDIT fd refused pid=%d uid=%d: %s", peer.pid, peer.uid, exc)
            fdpass.send_refusal(conn, str(exc))
            return
        if not self._grants.redeem(request.grant, tenant):
            why = InvalidArgumentError("grant", "unknown, spent, expired or issued to another tenant")
            logger.warning("AUDIT fd refused pid=%d uid=%d tenant=%s: %s", peer.pid, peer.uid, tenant, why)
            fdpass.send_refusal(conn, str(why))
            return
        segment = self._host.segment_of(tenant)
        if not is_sealed(segment.fd):
            logger.error("fd socket: segment %s is not sealed; not handed out", segment.name)
            fdpass.send_refusal(conn, f"segment {segment.name} is not sealed; see the daemon log")
            return
        fdpass.send_segment(conn, segment.name, segment.size, segment.fd)
        logger.info(
            "AUDIT fd granted pid=%d uid=%d tenant=%s segment=%s", peer.pid, peer.uid, tenant, segment.name
        )

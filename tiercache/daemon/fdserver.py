"""The isolated data plane, daemon side: tenant pools, one-time grants and the ``<socket>.fd`` listener.

With tokens configured, every tenant's L2 chunks live in that tenant's own anonymous segment
(:class:`~tiercache.tiers.host.HostTier` pools). Register assigns the namespace to its tenant's pool and
answers with a one-time grant; the engine redeems it on the side socket (:mod:`tiercache.fdpass`) with its
token and receives the pool's file descriptor. A grant is bound to the tenant it was issued to, spent on
first use and forgotten after :data:`GRANT_TTL_S`: a grant read off another engine's screen is worth
nothing without that tenant's token, and a token is worth nothing without a fresh grant. The listener runs
on its own thread (blocking accept, no polling); each request is answered at once.

Primitives:
    GRANT_TTL_S: how long a grant can be redeemed.
    Grants: issue / redeem (thread-safe).
    TenantPools: the pools, the grants and the listener: start, register (on Register), close.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from tiercache import fdpass
from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.host import HostTier

from .auth import Authenticator

logger = logging.getLogger(__name__)

GRANT_TTL_S = 60.0
"""Seconds a grant from Register can be redeemed on the fd socket."""
_GRANTS_KEPT = 65_536


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
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and listen on the fd socket (replacing a stale socket file), then serve on a thread.

        Raises:
            OSError: the socket cannot be bound.
        """
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, self._mode)
        sock.listen(64)
        self._sock = sock
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
            segment_bytes=self._host.slot_bytes * self._host.num_slots,
            max_chunk_bytes=self._host.max_chunk_bytes,
            fd_socket=self.socket_path,
            fd_grant=self._grants.issue(tenant),
        )

    def close(self) -> None:
        """Stop listening and remove the socket file (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _serve(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(5.0)
                try:
                    self._answer(conn)
                except OSError as exc:
                    logger.info("fd socket: a request failed (%s)", exc)

    def _answer(self, conn: socket.socket) -> None:
        peer = fdpass.peer_credentials(conn)
        try:
            request = fdpass.read_request(conn)
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
        fdpass.send_segment(conn, segment.name, segment.size, segment.fd)
        logger.info(
            "AUDIT fd granted pid=%d uid=%d tenant=%s segment=%s", peer.pid, peer.uid, tenant, segment.name
        )

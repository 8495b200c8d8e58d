"""The side channel that hands a tenant's shared-memory segment to its engines as a file descriptor.

A tenant's L2 pool has no name anywhere (``memfd_create``), so the only way into it is its file
descriptor. Next to its gRPC unix socket ``S`` the daemon listens on ``S.fd``; an engine that registered a
namespace (and got a one-time *grant* in ``RegisterResponse.data_plane``) connects, sends one request line
and receives one reply line, with the segment's descriptor attached to the reply (``SCM_RIGHTS``) when the
request is granted::

    request: {"token": "<bearer token or empty>", "grant": "<hex>"}\\n
    reply:   {"ok": true, "segment": "<name>", "size": <bytes>}\\n   + 1 descriptor
             {"ok": false, "error": "<why>"}\\n

The daemon checks the token (the tenant it names must be the tenant the grant was issued to), spends the
grant, and learns the peer's pid and uid from ``SO_PEERCRED`` for its audit log. An engine on another host
cannot reach the socket and uses the byte stream.

Primitives:
    FdRequest: a parsed request.
    PeerCredentials / peer_credentials: who is on the other end of a unix socket.
    parse_request / send_segment / send_refusal: the daemon's side (it reads the line itself, without
        blocking: :mod:`tiercache.daemon.fdserver`).
    request_segment: the engine's side (returns the segment's name and descriptor).
    MAX_LINE_BYTES: the longest request or reply line.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError, PermissionDeniedError, UnavailableError
from tiercache.shm import is_sealed

MAX_LINE_BYTES = 8192
"""The longest request or reply line (a token is short; anything longer is refused)."""
_UCRED = struct.Struct("3i")


@dataclass(frozen=True, slots=True)
class FdRequest:
    """A request for a segment: the caller's bearer token (empty without authentication) and grant."""

    token: str
    grant: bytes


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The process on the other end of a unix socket, as the kernel saw it at connect time."""

    pid: int
    uid: int
    gid: int


def peer_credentials(conn: socket.socket) -> PeerCredentials:
    """``SO_PEERCRED`` of a connected unix socket."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)


def parse_request(line: bytes) -> FdRequest:
    """Parse one request line (without or with its newline).

    Raises:
        InvalidArgumentError: naming the field, for a malformed request.
    """
    if len(line) > MAX_LINE_BYTES:
        raise InvalidArgumentError("request", f"longer than {MAX_LINE_BYTES} bytes")
    try:
        msg = json.loads(line)
    except ValueError:
        raise InvalidArgumentError("request", "not one JSON line") from None
    if not isinstance(msg, dict):
        raise InvalidArgumentError("request", "must be a JSON object")
    token, grant = msg.get("token", ""), msg.get("grant")
    if not isinstance(token, str):
        raise InvalidArgumentError("token", "must be a string")
    if not isinstance(grant, str):
        raise InvalidArgumentError("grant", "must be the hex fd_grant of RegisterResponse.data_plane")
    try:
        return FdRequest(token, bytes.fromhex(grant))
    except ValueError:
        raise InvalidArgumentError("grant", "must be hex") from None


def send_segment(conn: socket.socket, name: str, size: int, fd: int) -> None:
    """Grant a request: the reply line with the segment's descriptor attached (a reply this short fits an
    empty socket buffer: it does not block, nor fail with ``BlockingIOError``, on a fresh connection)."""
    line = json.dumps({"ok": True, "segment": name, "size": size}).encode() + b"\n"
    socket.send_fds(conn, [line], [fd])


def send_refusal(conn: socket.socket, error: str) -> None:
    """Refuse a request (no descriptor)."""
    conn.sendall(json.dumps({"ok": False, "error": error}).encode() + b"\n")


def request_segment(path: str, token: str | None, grant: bytes, timeout_s: float) -> tuple[str, int]:
    """Ask the daemon at ``path`` for the segment ``grant`` names; returns (segment name, descriptor).

    The caller owns the descriptor (map it, then close it). A descriptor whose size is not sealed is refused:
    whoever sent it could shrink it under this process's mapping (SIGBUS here); a tiercache daemon never
    hands out such a one.

    Raises:
        UnavailableError: the socket cannot be reached (another host, daemon gone), the reply is broken, or
            the descriptor is not a sealed segment.
        PermissionDeniedError: the daemon refused (bad token, spent or unknown grant); the message says why.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(path)
            request = {"token": token or "", "grant": grant.hex()}
            conn.sendall(json.dumps(request).encode() + b"\n")
            line, fds, _, _ = socket.recv_fds(conn, MAX_LINE_BYTES, 1)
    except OSError as exc:
        raise UnavailableError(f"fd socket {path}: {exc}") from None
    try:
        msg = json.loads(line)
        ok = bool(msg["ok"])
    except (ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        raise UnavailableError(f"fd socket {path}: malformed reply {line[:200]!r}") from None
    if not ok or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise PermissionDeniedError(f"fd socket {path}: {msg.get('error', 'no descriptor in the reply')}")
    if not is_sealed(fds[0]):
        os.close(fds[0])
        raise UnavailableError(
            f"fd socket {path}: the descriptor received is not a sealed segment; not mapped"
        )
    return str(msg["segment"]), fds[0]

"""The control socket's framing: unary calls of the service over a plain unix socket, without gRPC.

Why: an engine calls the daemon between model steps, so its calls find gRPC's threads idle, and a gRPC
call after idle costs ~1.5-2 ms on these machines against ~0.1 ms for a bare unix-socket round trip. For a
request whose cache hit is worth a few milliseconds, that one call is most of the cost. Same-host engines
therefore send their unary calls over the daemon's control socket, with the very same protobuf messages,
handlers, authentication and status codes as through gRPC; byte streams and the first Register stay on gRPC.

The protocol, little-endian, one call at a time per connection:

- the client opens a connection and sends a *hello*: ``HELLO`` (u32 body length, u8 0) and the body, the
  bearer token in UTF-8 (empty: none). Nothing answers it; the token is checked on every call, exactly as
  gRPC's call metadata is;
- a *call*: ``CALL`` (u32 body length, u8 method-name length), the method name in ASCII (``Lookup``), the
  serialized request;
- its *answer*: ``ANSWER`` (u32 body length, u8 status code: gRPC's numbering), then the serialized response
  (status 0) or the status details in UTF-8.

Primitives:
    HELLO, CALL, ANSWER: the frame headers.
    MAX_METHOD_NAME: the longest method name a call frame carries.
    hello_frame, call_frame, answer_frame: the bytes of a frame.
    read_exactly: fill a buffer from a blocking socket (the client's side).
"""

from __future__ import annotations

import socket
import struct

HELLO = struct.Struct("<IB")
"""The hello's header: token length, then 0."""
CALL = struct.Struct("<IB")
"""A call's header: request length, method-name length."""
ANSWER = struct.Struct("<IB")
"""An answer's header: body length, status code (0: OK)."""
MAX_METHOD_NAME = 64


def hello_frame(token: str | None) -> bytes:
    """The hello of a connection carrying ``token`` (None: no token)."""
    body = (token or "").encode()
    return HELLO.pack(len(body), 0) + body


def call_frame(method: str, request: bytes) -> bytes:
    """A call of ``method`` (an ASCII name of at most :data:`MAX_METHOD_NAME` bytes) with ``request``."""
    name = method.encode("ascii")
    if not 0 < len(name) <= MAX_METHOD_NAME:
        raise ValueError(f"method name must have 1..{MAX_METHOD_NAME} bytes, got {method!r}")
    return CALL.pack(len(request), len(name)) + name + request


def answer_frame(code: int, body: bytes) -> bytes:
    """An answer with status ``code`` (0: ``body`` is the response; else its details)."""
    return ANSWER.pack(len(body), code) + body


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """Read exactly ``size`` bytes from a blocking socket.

    Raises:
        ConnectionError: the peer closed the connection first.
        TimeoutError: the socket's timeout ran out.
    """
    if size == 0:
        return b""
    first = sock.recv(size)
    if len(first) == size:
        return first
    buf = bytearray(size)
    view = memoryview(buf)
    got = len(first)
    if got == 0:
        raise ConnectionError("the daemon closed the control connection")
    view[:got] = first
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("the daemon closed the control connection")
        got += n
    return bytes(buf)

"""Bare gRPC baselines over the daemon's own socket: ``Diagnostics.Echo`` and ``Diagnostics.EchoStream``.

The daemon serves them on the same server and socket as the cache, with no cache work, so a cache RPC
compared with them shows what the cache adds to the transport.

Primitives:
    DiagnosticsProbe: a channel to the daemon's Diagnostics service.
    DiagnosticsProbe.echo_latency: per-call latency of a unary echo of a given size.
    DiagnosticsProbe.stream_timing: throughput of a bidirectional echo stream of messages of a given size
        (bytes sent plus bytes received).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from tiercache.connector import ChannelConfig, parse_address
from tiercache.connector.channel import auth_metadata, open_channel
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import DiagnosticsStub

from .timing import Latency, Timing, summarize, time_latency

_TIMEOUT_S = 60.0


class EchoMismatchError(RuntimeError):
    """An echo came back with other bytes than were sent."""


class DiagnosticsProbe:
    """A channel to the daemon's ``tiercache.v1.Diagnostics`` service."""

    def __init__(self, address: str, token: str | None = None, max_message_bytes: int = 64 << 20) -> None:
        """Open a channel to ``address`` (connects lazily)."""
        self._channel = open_channel(
            parse_address(address), ChannelConfig(max_message_bytes=max_message_bytes)
        )
        self._stub: Any = DiagnosticsStub(self._channel)
        self._metadata = auth_metadata(token)

    def __enter__(self) -> DiagnosticsProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def echo_latency(self, payload: bytes, calls: int, warmup: int = 10) -> Latency:
        """Latency of ``Echo(payload)``; every reply is checked.

        Raises:
            EchoMismatchError: a reply differed from the request.
            grpc.RpcError: the call failed.
        """
        request = pb.EchoMessage(data=payload)

        def call() -> None:
            reply = self._stub.Echo(request, timeout=_TIMEOUT_S, metadata=self._metadata)
            if reply.data != payload:
                raise EchoMismatchError(f"Echo returned {len(reply.data)} other bytes for {len(payload)}")

        return time_latency(call, calls, warmup)

    def stream_timing(self, message_bytes: int, total_bytes: int, warmup: bool = True) -> Timing:
        """Throughput of ``EchoStream`` over ``total_bytes`` in messages of ``message_bytes``.

        The timing's bytes are the bytes sent plus the bytes received back: the bare transport moves data
        both ways at once, so this is the conservative baseline for a one-way stream of the same messages
        (the Diagnostics service has no one-way stream). Its one "call" is the whole stream.

        Raises:
            EchoMismatchError: fewer bytes came back than were sent, or other bytes.
            grpc.RpcError: the call failed.
        """
        count = max(1, -(-total_bytes // message_bytes))
        data = bytes(range(256)) * (message_bytes // 256) + bytes(message_bytes % 256)
        if warmup:
            self._stream(data, min(count, 4))
        start = time.perf_counter()
        self._stream(data, count)
        seconds = time.perf_counter() - start
        return summarize(2 * count * message_bytes, seconds, [seconds])

    def _stream(self, data: bytes, count: int) -> None:
        def messages() -> Iterator[pb.EchoMessage]:
            message = pb.EchoMessage(data=data)
            for _ in range(count):
                yield message

        received = 0
        for reply in self._stub.EchoStream(messages(), timeout=_TIMEOUT_S, metadata=self._metadata):
            if len(reply.data) != len(data) or reply.data[:64] != data[:64]:
                raise EchoMismatchError("EchoStream returned other bytes than were sent")
            received += 1
        if received != count:
            raise EchoMismatchError(f"EchoStream returned {received} messages for {count}")

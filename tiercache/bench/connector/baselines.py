"""Bare gRPC baselines over the daemon's own socket: ``Diagnostics.Echo`` and the one-way streams.

The daemon serves them on the same server and socket as the cache (and Echo on its control socket too),
with no cache work, so a cache RPC compared with them shows what the cache adds to the transport.

Primitives:
    DiagnosticsProbe: a channel to the daemon's Diagnostics service.
    DiagnosticsProbe.echo_latency: per-call latency of a unary echo of a given size.
    DiagnosticsProbe.control_echo_latency: the same over the daemon's control socket.
    DiagnosticsProbe.sink_timing / source_timing: throughput of a one-way stream of messages of a given
        size to / from the daemon (the ceilings of StreamStore / StreamLoad).
"""

from __future__ import annotations

import time
from typing import Any

from tiercache.connector import ChannelConfig, parse_address
from tiercache.connector.channel import auth_metadata, open_channel
from tiercache.connector.control import ControlSocket
from tiercache.connector.rpcs import UnaryRpc
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import DiagnosticsStub
from tiercache.wire.framing import split

from ..common.timing import Latency, Timing, summarize, time_latency

_TIMEOUT_S = 60.0
_ECHO = UnaryRpc("Echo", pb.EchoMessage, pb.EchoMessage)


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
        self._source_call = self._channel.unary_stream(
            "/tiercache.v1.Diagnostics/SourceStream",
            request_serializer=pb.SourceRequest.SerializeToString,
            _registered_method=True,
        )  # responses as received: checked in place, like the byte stream's pieces
        self._metadata = auth_metadata(token)
        self._token = token

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

    def control_echo_latency(self, path: str, payload: bytes, calls: int, warmup: int = 10) -> Latency:
        """Latency of ``Echo(payload)`` over the daemon's control socket at ``path``: the bare cost of a
        unary call there (what an engine's calls pay instead of gRPC's); every reply is checked.

        Raises:
            EchoMismatchError: a reply differed from the request.
            grpc.RpcError: the call failed.
        """
        request = pb.EchoMessage(data=payload)
        control = ControlSocket(path, self._token)

        def call() -> None:
            reply = control.call(_ECHO, request, _TIMEOUT_S)
            if reply.data != payload:
                raise EchoMismatchError(f"Echo returned {len(reply.data)} other bytes for {len(payload)}")

        try:
            return time_latency(call, calls, warmup)
        finally:
            control.close()

    def sink_timing(self, message_bytes: int, total_bytes: int, warmup: bool = True) -> Timing:
        """Throughput of ``SinkStream``: ``total_bytes`` (rounded up to whole messages) sent one way, in
        messages of ``message_bytes`` data bytes (one message, serialized for each send: one copy, like a
        framed piece). Its one "call" is the whole stream.

        Raises:
            EchoMismatchError: the daemon counted other messages or bytes than were sent.
            grpc.RpcError: the call failed.
        """
        count = max(1, -(-total_bytes // message_bytes))
        message = pb.EchoMessage(data=_pattern(message_bytes))
        if warmup:
            self._sink(message, min(count, 4))
        start = time.perf_counter()
        self._sink(message, count)
        seconds = time.perf_counter() - start
        return summarize(count * message_bytes, seconds, [seconds])

    def source_timing(self, message_bytes: int, total_bytes: int, warmup: bool = True) -> Timing:
        """Throughput of ``SourceStream``: the same, from the daemon; the messages are checked in place
        (framed: their data is a view into the received bytes, never copied here).

        Raises:
            EchoMismatchError: other messages or bytes came back than were asked for.
            grpc.RpcError: the call failed.
        """
        count = max(1, -(-total_bytes // message_bytes))
        if warmup:
            self._source(message_bytes, min(count, 4))
        start = time.perf_counter()
        self._source(message_bytes, count)
        seconds = time.perf_counter() - start
        return summarize(count * message_bytes, seconds, [seconds])

    def _sink(self, message: pb.EchoMessage, count: int) -> None:
        summary = self._stub.SinkStream(iter([message] * count), timeout=_TIMEOUT_S, metadata=self._metadata)
        if summary.messages != count or summary.bytes != count * len(message.data):
            raise EchoMismatchError(
                f"SinkStream counted {summary.messages} messages / {summary.bytes} bytes for {count}"
            )

    def _source(self, message_bytes: int, count: int) -> None:
        request = pb.SourceRequest(message_bytes=message_bytes, count=count)
        head = _pattern(64)
        received = 0
        for raw in self._source_call(request, timeout=_TIMEOUT_S, metadata=self._metadata):
            data = memoryview(split(raw, pb.EchoMessage).data)
            if data.nbytes != message_bytes or data[: len(head)] != head[: data.nbytes]:
                raise EchoMismatchError("SourceStream sent other bytes than were asked for")
            received += 1
        if received != count:
            raise EchoMismatchError(f"SourceStream sent {received} messages for {count}")


def _pattern(nbytes: int) -> bytes:
    """``nbytes`` bytes of 0, 1, ..., 255, 0, ... (as the daemon's SourceStream sends)."""
    return bytes(range(256)) * (nbytes // 256) + bytes(range(nbytes % 256))

"""The ``tiercache.v1.Diagnostics`` servicer: bare echo baselines over the same server and socket.

The benchmark compares the data planes against these echoes, so they do no more than a call must: they are
authenticated (through the decorators of :mod:`.rpc`, like every RPC) but not recorded in the RPC metrics.

The one-way streams are the ceilings of the byte-stream data plane, framed like it (the data of a
received message is a view, never copied by protobuf; a sent message is written in one copy).

Primitives:
    DiagnosticsServicer: Echo, EchoStream, SinkStream, SourceStream.
    MAX_SOURCE_COUNT: the most messages one SourceStream sends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import grpc

from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.wire.framing import Framed, split

from .config import MESSAGE_OVERHEAD_BYTES
from .decode import WireCodec
from .rpc import ServicerBase, server_stream_tenant, unary_tenant

MAX_SOURCE_COUNT = 1 << 20


def _parse_sink_message(raw: bytes) -> Framed[pb.EchoMessage]:
    return split(raw, pb.EchoMessage)


class DiagnosticsServicer(ServicerBase, pb_grpc.DiagnosticsServicer):
    """``tiercache.v1.Diagnostics``: Echo, EchoStream and the one-way SinkStream, SourceStream."""

    WIRE_CODECS: ClassVar[Mapping[str, WireCodec]] = {
        "SinkStream": WireCodec(_parse_sink_message, pb.SinkSummary.SerializeToString)
    }

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record nothing: the echoes are baselines of the transport alone."""

    @unary_tenant
    async def Echo(self, request: pb.EchoMessage, tenant: str, context: Any) -> pb.EchoMessage:
        """Return the request's bytes."""
        return pb.EchoMessage(data=request.data)

    @server_stream_tenant
    async def EchoStream(
        self, request_iterator: AsyncIterator[pb.EchoMessage], tenant: str, context: Any
    ) -> AsyncIterator[pb.EchoMessage]:
        """Return every message's bytes."""
        async for message in request_iterator:
            yield pb.EchoMessage(data=message.data)

    @unary_tenant
    async def SinkStream(
        self, request_iterator: AsyncIterator[Framed[pb.EchoMessage]], tenant: str, context: Any
    ) -> pb.SinkSummary:
        """Count the messages and data bytes received, and drop them."""
        messages = nbytes = 0
        async for message in request_iterator:
            messages += 1
            nbytes += memoryview(message.data).nbytes
        return pb.SinkSummary(messages=messages, bytes=nbytes)

    @server_stream_tenant
    async def SourceStream(
        self, request: pb.SourceRequest, tenant: str, context: Any
    ) -> AsyncIterator[pb.EchoMessage]:
        """Send ``count`` messages of ``message_bytes`` bytes (one message, serialized for each send)."""
        limit = self._deps.stream.max_message_bytes - MESSAGE_OVERHEAD_BYTES
        if not 0 < request.message_bytes <= limit:
            raise InvalidArgumentError(
                "message_bytes", f"must be in [1, {limit}], got {request.message_bytes}"
            )
        if request.count > MAX_SOURCE_COUNT:
            raise InvalidArgumentError("count", f"at most {MAX_SOURCE_COUNT}, got {request.count}")
        n = request.message_bytes
        message = pb.EchoMessage(data=bytes(range(256)) * (n // 256) + bytes(range(n % 256)))
        for _ in range(request.count):
            yield message

"""The ``tiercache.v1.Diagnostics`` servicer: bare echo baselines over the same server and socket.

The benchmark compares the data planes against these echoes, so they do no more than a call must: they are
authenticated (through the decorators of :mod:`.rpc`, like every RPC) but not recorded in the RPC metrics.

Primitives:
    DiagnosticsServicer: Echo, EchoStream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

from .rpc import ServicerBase, server_stream_tenant, unary_tenant


class DiagnosticsServicer(ServicerBase, pb_grpc.DiagnosticsServicer):
    """``tiercache.v1.Diagnostics``: Echo and EchoStream."""

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

"""The registration of :mod:`tiercache.daemon.decode`: every method of a service gets a guarded handler.

A servicer that would leave a method to the generated UNIMPLEMENTED stub (a plain function, whose call style
the decode guard cannot keep) is refused when it is registered, naming the method, instead of answering
garbage with whatever that stub does.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import grpc
import pytest

from tiercache.daemon.decode import method_handlers
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

DIAGNOSTICS = pb.DESCRIPTOR.services_by_name["Diagnostics"]


class _EchoOnly(pb_grpc.DiagnosticsServicer):
    """Serves Echo; EchoStream is left to the generated stub."""

    async def Echo(self, request: pb.EchoMessage, context: object) -> pb.EchoMessage:
        return request


class _Both(_EchoOnly):
    async def EchoStream(self, request_iterator: object, context: object) -> AsyncIterator[pb.EchoMessage]:
        yield pb.EchoMessage()

    async def SinkStream(self, request_iterator: object, context: object) -> pb.SinkSummary:
        return pb.SinkSummary()

    async def SourceStream(self, request: object, context: object) -> AsyncIterator[pb.EchoMessage]:
        yield pb.EchoMessage()


def test_a_method_left_to_the_generated_stub_is_refused() -> None:
    with pytest.raises(TypeError, match=re.escape("tiercache.v1.Diagnostics/EchoStream")):
        method_handlers(_EchoOnly(), DIAGNOSTICS)


def test_every_method_gets_a_handler_of_its_kind() -> None:
    handlers = method_handlers(_Both(), DIAGNOSTICS)
    assert set(handlers) == {m.name for m in DIAGNOSTICS.methods}
    assert isinstance(handlers["Echo"], grpc.RpcMethodHandler)
    assert not handlers["Echo"].request_streaming and not handlers["Echo"].response_streaming
    assert handlers["EchoStream"].request_streaming and handlers["EchoStream"].response_streaming

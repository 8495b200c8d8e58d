"""The connector's stub of ``KVCacheService``: the generated one, with the byte streams framed.

The generated stub serializes a ``StreamStoreMessage`` and parses a ``StreamLoadMessage`` through protobuf,
which copies every piece's data several times. This stub sends StreamStore requests that are either
protobuf messages or :class:`~tiercache.wire.framing.Framed` pieces (header and data written in one
copy), and hands StreamLoad responses over as ``Framed`` pieces whose data is a view into the received
bytes (:func:`~tiercache.wire.framing.split`). Every other RPC is the generated one.

Primitives:
    ServiceStub: the stub the connection uses.
    serialize_request: a request message or a framed piece -> wire bytes.
    parse_load_piece: wire bytes -> a framed ``StreamLoadMessage``.
"""

from __future__ import annotations

import grpc
from google.protobuf.message import Message

from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import KVCacheServiceStub
from tiercache.wire.framing import Framed, split

_SERVICE = "/tiercache.v1.KVCacheService/"


def serialize_request(request: Message | Framed[pb.StreamStoreMessage]) -> bytes:
    """The wire bytes of a request: a framed piece writes its data once, a message goes through protobuf."""
    if isinstance(request, Framed):
        return request.serialize()
    return request.SerializeToString()


def parse_load_piece(raw: bytes) -> Framed[pb.StreamLoadMessage]:
    """A StreamLoad message, its data a view into ``raw`` (raises ``DecodeError`` when malformed)."""
    return split(raw, pb.StreamLoadMessage)


class ServiceStub(KVCacheServiceStub):
    """``KVCacheServiceStub`` whose StreamStore and StreamLoad carry framed pieces."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(channel)  # type: ignore[no-untyped-call]
        self.StreamStore = channel.stream_unary(
            _SERVICE + "StreamStore",
            request_serializer=serialize_request,
            response_deserializer=pb.StreamStoreResponse.FromString,
            _registered_method=True,
        )
        self.StreamLoad = channel.unary_stream(
            _SERVICE + "StreamLoad",
            request_serializer=pb.StreamLoadRequest.SerializeToString,
            response_deserializer=parse_load_piece,
            _registered_method=True,
        )

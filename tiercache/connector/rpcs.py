"""The daemon's RPCs as typed descriptors: what each one takes and returns, checked by mypy.

The generated ``KVCacheServiceStub`` has untyped attributes; every call of the connector goes through one
descriptor here instead, so that mypy checks the request built and the response read against the
``tiercache.v1`` message types. A test compares this table with the service in the generated descriptor.

Primitives:
    UnaryRpc: one request, one response (``invoke``, ``future``).
    StreamUnaryRpc: a request stream, one response (``invoke``).
    UnaryStreamRpc: one request, a response stream (``invoke`` gives a ``ResponseStream``).
    ResponseStream: the iterable, cancellable answer of a server-streaming call.
    REGISTER, LOOKUP, ..., STREAM_STORE, STREAM_LOAD: the RPCs the client calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

import grpc
from google.protobuf.message import Message

from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import KVCacheServiceStub
from tiercache.wire.framing import Framed

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
Resp_co = TypeVar("Resp_co", covariant=True)
Metadata = tuple[tuple[str, str], ...]


class ResponseStream(Protocol[Resp_co]):
    """The answer of a server-streaming call: iterate it for the messages; ``cancel`` stops the call."""

    def __iter__(self) -> Iterator[Resp_co]: ...

    def cancel(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class UnaryRpc(Generic[Req, Resp]):
    """A unary RPC of the service.

    Attributes:
        name: the method name in the service.
        request: the request message class.
        response: the response message class.
    """

    name: str
    request: type[Req]
    response: type[Resp]

    def invoke(self, stub: KVCacheServiceStub, request: Req, timeout_s: float, metadata: Metadata) -> Resp:
        """Call the RPC and wait for its answer (raises ``grpc.RpcError``)."""
        return cast(Resp, getattr(stub, self.name)(request, timeout=timeout_s, metadata=metadata))

    def future(
        self, stub: KVCacheServiceStub, request: Req, timeout_s: float, metadata: Metadata
    ) -> grpc.Future:
        """Send the RPC without waiting; the future resolves to the response or the ``grpc.RpcError``."""
        return cast(
            grpc.Future, getattr(stub, self.name).future(request, timeout=timeout_s, metadata=metadata)
        )


@dataclass(frozen=True, slots=True)
class StreamUnaryRpc(Generic[Req, Resp]):
    """A client-streaming RPC: a stream of requests, one response."""

    name: str
    request: type[Req]
    response: type[Resp]

    def invoke(
        self,
        stub: KVCacheServiceStub,
        requests: Iterable[Req | Framed[Req]],
        timeout_s: float,
        metadata: Metadata,
    ) -> Resp:
        """Send ``requests`` (consumed lazily; framed pieces through :class:`~.stub.ServiceStub`) and wait
        for the answer (raises ``grpc.RpcError``)."""
        return cast(Resp, getattr(stub, self.name)(iter(requests), timeout=timeout_s, metadata=metadata))


@dataclass(frozen=True, slots=True)
class UnaryStreamRpc(Generic[Req, Resp]):
    """A server-streaming RPC: one request, a stream of responses, which arrive framed (the byte stream's
    pieces, parsed by :class:`~.stub.ServiceStub` with their data left in the received bytes)."""

    name: str
    request: type[Req]
    response: type[Resp]

    def invoke(
        self, stub: KVCacheServiceStub, request: Req, timeout_s: float, metadata: Metadata
    ) -> ResponseStream[Framed[Resp]]:
        """Start the call; iterating the answer raises ``grpc.RpcError`` on failure."""
        return cast(
            ResponseStream[Framed[Resp]],
            getattr(stub, self.name)(request, timeout=timeout_s, metadata=metadata),
        )


REGISTER = UnaryRpc("Register", pb.RegisterRequest, pb.RegisterResponse)
LOOKUP = UnaryRpc("Lookup", pb.LookupRequest, pb.LookupResponse)
PREFETCH = UnaryRpc("Prefetch", pb.PrefetchRequest, pb.PrefetchResponse)
CANCEL_PREFETCH = UnaryRpc("CancelPrefetch", pb.CancelPrefetchRequest, pb.CancelPrefetchResponse)
BEGIN_STORE = UnaryRpc("BeginStore", pb.BeginStoreRequest, pb.BeginStoreResponse)
COMMIT_STORE = UnaryRpc("CommitStore", pb.CommitStoreRequest, pb.CommitStoreResponse)
ABORT_STORE = UnaryRpc("AbortStore", pb.AbortStoreRequest, pb.AbortStoreResponse)
ACQUIRE_LOAD = UnaryRpc("AcquireLoad", pb.AcquireLoadRequest, pb.AcquireLoadResponse)
RELEASE_LOAD = UnaryRpc("ReleaseLoad", pb.ReleaseLoadRequest, pb.ReleaseLoadResponse)
CLAIM_PREFILL = UnaryRpc("ClaimPrefill", pb.ClaimPrefillRequest, pb.ClaimPrefillResponse)
WAIT_PREFILL = UnaryRpc("WaitPrefill", pb.WaitPrefillRequest, pb.WaitPrefillResponse)
RELEASE_PREFILL = UnaryRpc("ReleasePrefill", pb.ReleasePrefillRequest, pb.ReleasePrefillResponse)
REPORT_USAGE = UnaryRpc("ReportUsage", pb.ReportUsageRequest, pb.ReportUsageResponse)
PIN = UnaryRpc("Pin", pb.PinRequest, pb.PinResponse)
UNPIN = UnaryRpc("Unpin", pb.PinRequest, pb.PinResponse)
PURGE = UnaryRpc("Purge", pb.PurgeRequest, pb.PurgeResponse)
STATS = UnaryRpc("Stats", pb.StatsRequest, pb.StatsResponse)
STREAM_STORE = StreamUnaryRpc("StreamStore", pb.StreamStoreMessage, pb.StreamStoreResponse)
STREAM_LOAD = UnaryStreamRpc("StreamLoad", pb.StreamLoadRequest, pb.StreamLoadMessage)

AnyRpc = UnaryRpc[Any, Any] | StreamUnaryRpc[Any, Any] | UnaryStreamRpc[Any, Any]

ALL: tuple[AnyRpc, ...] = (
    REGISTER,
    LOOKUP,
    PREFETCH,
    CANCEL_PREFETCH,
    BEGIN_STORE,
    COMMIT_STORE,
    ABORT_STORE,
    ACQUIRE_LOAD,
    RELEASE_LOAD,
    CLAIM_PREFILL,
    WAIT_PREFILL,
    RELEASE_PREFILL,
    REPORT_USAGE,
    PIN,
    UNPIN,
    PURGE,
    STATS,
    STREAM_STORE,
    STREAM_LOAD,
)
"""Every RPC of ``KVCacheService`` the client calls: all but WatchEvents (the operators' event feed)."""

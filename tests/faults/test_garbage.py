"""Bytes that are no protobuf message, sent to every RPC of the daemon, answer INVALID_ARGUMENT naming the method.

The methods come from the service descriptors of the proto file (every service it declares), so a new RPC is
covered without a change here. Each gets several seeded random byte strings, a lone varint continuation byte,
an overlong varint and a truncated valid request, through a raw channel (bytes in, no serializer), in the
shape of its kind (unary or streaming request and response). Afterwards the same daemon still answers a valid
Stats and Echo, and its log shows that no decode error escaped into the framework.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from tests.daemon.conftest import RPC_TIMEOUT_S, DaemonProc
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.testing.faults.garbage import RANDOM_PER_METHOD, undecodable_bodies

SERVICES = tuple(pb.DESCRIPTOR.services_by_name.values())
METHODS = tuple(method for service in SERVICES for method in service.methods)


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def garbage_of(method: MethodDescriptor) -> list[bytes]:
    """Every malformed request body sent to ``method`` (the bench's own), each checked not to decode."""
    cls: type[Message] = message_factory.GetMessageClass(method.input_type)
    bodies = undecodable_bodies(method)
    assert len(bodies) == 3 + RANDOM_PER_METHOD
    for body in bodies:
        with pytest.raises(DecodeError):
            cls.FromString(body)
    return bodies


def _call(channel: grpc.Channel, method: MethodDescriptor, body: bytes) -> None:
    """Send ``body`` as the (first and only) request message of ``method`` and read the whole answer."""
    path = _path(method)
    if method.client_streaming:
        requests: Iterator[bytes] = iter([body])
        if method.server_streaming:
            list(channel.stream_stream(path)(requests, timeout=RPC_TIMEOUT_S))
        else:
            channel.stream_unary(path)(requests, timeout=RPC_TIMEOUT_S)
    elif method.server_streaming:
        list(channel.unary_stream(path)(body, timeout=RPC_TIMEOUT_S))
    else:
        channel.unary_unary(path)(body, timeout=RPC_TIMEOUT_S)


def test_the_descriptors_name_both_services() -> None:
    """The loop below covers what the daemon serves: both services, streaming methods included."""
    assert {s.full_name for s in SERVICES} == {"tiercache.v1.KVCacheService", "tiercache.v1.Diagnostics"}
    kinds = {(m.client_streaming, m.server_streaming) for m in METHODS}
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}


@pytest.mark.parametrize("method", METHODS, ids=_path)
def test_garbage_answers_invalid_argument(shared_daemon: DaemonProc, method: MethodDescriptor) -> None:
    channel = shared_daemon.channel()
    name = f"{method.containing_service.full_name}/{method.name}"
    for body in garbage_of(method):
        with pytest.raises(grpc.RpcError) as err:
            _call(channel, method, body)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (body, err.value.details())
        details = err.value.details()
        assert name in details
        assert "could not be decoded" in details
        assert method.input_type.full_name in details
    assert shared_daemon.proc.poll() is None


def test_daemon_serves_after_garbage(shared_daemon: DaemonProc) -> None:
    """Runs after the garbage (file order): valid calls still work, and no decode error reached grpc."""
    channel = shared_daemon.channel()
    stats = pb_grpc.KVCacheServiceStub(channel).Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert stats.tiers
    echo = pb_grpc.DiagnosticsStub(channel).Echo(pb.EchoMessage(data=b"still here"), timeout=RPC_TIMEOUT_S)
    assert echo.data == b"still here"
    streamed = list(
        pb_grpc.DiagnosticsStub(channel).EchoStream(
            iter([pb.EchoMessage(data=b"a"), pb.EchoMessage(data=b"b")]), timeout=RPC_TIMEOUT_S
        )
    )
    assert [m.data for m in streamed] == [b"a", b"b"]
    assert shared_daemon.proc.poll() is None
    log = shared_daemon.stderr()
    assert "undecodable request" in log
    assert "DecodeError" not in log

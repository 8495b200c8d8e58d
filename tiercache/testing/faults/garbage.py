"""Garbage on every RPC: bytes that are no protobuf message of the method's request type, sent through a
raw channel to every method of every service the proto file declares; every answer must be a deliberate
``INVALID_ARGUMENT`` and the daemon must stay up.

Per method: seeded random byte strings that do not decode, a lone varint continuation byte, an overlong
varint and a truncated valid request, each in the shape of the method (unary or streaming).

Primitives:
    undecodable_bodies: the malformed request bodies of one method (each checked not to decode).
    GarbageReport: RPCs sent, answered INVALID_ARGUMENT, answered otherwise (by code), daemon alive.
    run_garbage: send them to a daemon address; the report.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message

from tiercache.proto import tiercache_pb2 as pb

RANDOM_PER_METHOD = 4
"""Seeded random undecodable strings per method (besides the three fixed bodies)."""
LONE_CONTINUATION = b"\x80"
"""A tag varint that starts and never ends."""
OVERLONG_VARINT = b"\x08" + b"\xff" * 11
"""Field 1, wire type varint, and a value of more than the 10 bytes a varint may take."""
_RANDOM_DRAWS = 1000
_TIMEOUT_S = 10.0
_BIG_INTS = {
    FieldDescriptor.TYPE_INT32: 1 << 30,
    FieldDescriptor.TYPE_INT64: 1 << 40,
    FieldDescriptor.TYPE_UINT32: 1 << 30,
    FieldDescriptor.TYPE_UINT64: 1 << 40,
    FieldDescriptor.TYPE_SINT32: 1 << 29,
    FieldDescriptor.TYPE_SINT64: 1 << 40,
}


def _methods() -> list[MethodDescriptor]:
    return [m for service in pb.DESCRIPTOR.services_by_name.values() for m in service.methods]


def _undecodable(cls: type[Message], data: bytes) -> bool:
    try:
        cls.FromString(data)
    except DecodeError:
        return True
    return False


def _truncated(cls: type[Message]) -> bytes:
    """A valid ``cls`` with every singular string, bytes and integer field set, less its last byte.

    Every such field ends in a byte a parser needs (a length-delimited value or a multi-byte varint). A
    request type without any gets an unknown length-delimited field instead.
    """
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        if field.is_repeated or field.containing_oneof is not None:
            continue
        if field.type == FieldDescriptor.TYPE_STRING:
            setattr(msg, field.name, "s" * 16)
        elif field.type == FieldDescriptor.TYPE_BYTES:
            setattr(msg, field.name, b"b" * 16)
        elif field.type in _BIG_INTS:
            setattr(msg, field.name, _BIG_INTS[field.type])
    data = msg.SerializeToString() or b"\x0a\x10" + b"u" * 16
    if _undecodable(cls, data):
        raise RuntimeError(f"a filled {cls.DESCRIPTOR.full_name} does not decode before it is truncated")
    return data[:-1]


def _random_garbage(cls: type[Message], seed: str) -> list[bytes]:
    """Seeded random byte strings that do not decode as ``cls`` (most random strings do not)."""
    rng = random.Random(seed)
    found: list[bytes] = []
    for _ in range(_RANDOM_DRAWS):
        data = rng.randbytes(rng.randint(1, 96))
        if _undecodable(cls, data):
            found.append(data)
            if len(found) == RANDOM_PER_METHOD:
                return found
    raise RuntimeError(f"fewer than {RANDOM_PER_METHOD} undecodable strings in {_RANDOM_DRAWS} draws")


def undecodable_bodies(method: MethodDescriptor) -> list[bytes]:
    """The malformed request bodies sent to ``method``: a lone varint continuation byte, an overlong varint,
    a truncated valid request and ``RANDOM_PER_METHOD`` seeded random strings, each one that does not decode.

    Raises:
        RuntimeError: one of them decodes after all (the generator, not the daemon, is broken).
    """
    cls: type[Message] = message_factory.GetMessageClass(method.input_type)
    bodies = [LONE_CONTINUATION, OVERLONG_VARINT, _truncated(cls), *_random_garbage(cls, method.full_name)]
    for body in bodies:
        if not _undecodable(cls, body):
            raise RuntimeError(f"{body!r} decodes as {cls.DESCRIPTOR.full_name}")
    return bodies


def _call(channel: grpc.Channel, method: MethodDescriptor, body: bytes) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.client_streaming:
        requests: Iterator[bytes] = iter([body])
        if method.server_streaming:
            list(channel.stream_stream(path)(requests, timeout=_TIMEOUT_S))
        else:
            channel.stream_unary(path)(requests, timeout=_TIMEOUT_S)
    elif method.server_streaming:
        list(channel.unary_stream(path)(body, timeout=_TIMEOUT_S))
    else:
        channel.unary_unary(path)(body, timeout=_TIMEOUT_S)


@dataclass(frozen=True, slots=True)
class GarbageReport:
    """Figures of a garbage run.

    Attributes:
        methods: RPC methods covered.
        sent: malformed requests sent.
        invalid_argument: answered INVALID_ARGUMENT (the deliberate status).
        other: any other answer, by status name (an OK answer counts as ``OK``).
    """

    methods: int
    sent: int
    invalid_argument: int
    other: dict[str, int]


def run_garbage(address: str) -> GarbageReport:
    """Send every method's malformed bodies to the daemon at ``address``; the statuses it answered."""
    codes: Counter[str] = Counter()
    methods = _methods()
    with grpc.insecure_channel(address) as channel:
        for method in methods:
            for body in undecodable_bodies(method):
                try:
                    _call(channel, method, body)
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1
    sent = sum(codes.values())
    invalid = codes.pop("INVALID_ARGUMENT", 0)
    return GarbageReport(len(methods), sent, invalid, dict(codes))

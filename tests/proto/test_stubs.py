"""The committed stubs match ``proto/tiercache/proto/tiercache.proto`` (regenerate with ``python proto/generate.py``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tiercache.proto import tiercache_pb2, tiercache_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("tiercache_proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _normalized(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    """A FileDescriptorProto without the json names (the Python generator drops them)."""
    fdp = descriptor_pb2.FileDescriptorProto.FromString(serialized)

    def strip(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for msg in messages:
            for field in msg.field:
                field.ClearField("json_name")
            strip(msg.nested_type)

    strip(fdp.message_type)
    return fdp


def test_committed_messages_match_the_proto() -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[dev]')")
    fresh = _normalized(_generator().descriptor_set())  # type: ignore[attr-defined]
    committed = _normalized(tiercache_pb2.DESCRIPTOR.serialized_pb)
    assert committed == fresh, "stale stubs: run `python proto/generate.py`"


def test_committed_grpc_stubs_cover_every_method() -> None:
    for service in tiercache_pb2.DESCRIPTOR.services_by_name.values():
        stub_cls = getattr(tiercache_pb2_grpc, f"{service.name}Stub")
        servicer_cls = getattr(tiercache_pb2_grpc, f"{service.name}Servicer")
        for method in service.methods:
            assert method.name in stub_cls.__init__.__code__.co_names or hasattr(servicer_cls, method.name)
            assert hasattr(servicer_cls, method.name), f"{service.name}.{method.name} missing: regenerate"
    assert tiercache_pb2.DESCRIPTOR.package == "tiercache.v1"


def test_no_pickled_objects_on_the_wire() -> None:
    # Every field is a scalar, bytes, string, enum or one of our own messages.
    for message in tiercache_pb2.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            if field.message_type is not None:
                assert field.message_type.file is tiercache_pb2.DESCRIPTOR, f"{message.name}.{field.name}"

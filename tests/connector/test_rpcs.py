"""The typed RPC table matches the service in the generated descriptor: names, message types, streaming."""

from __future__ import annotations

from tiercache.connector import rpcs
from tiercache.proto import tiercache_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["KVCacheService"]


def test_every_rpc_names_a_service_method_with_its_message_types() -> None:
    assert len({r.name for r in rpcs.ALL}) == len(rpcs.ALL)
    for rpc in rpcs.ALL:
        method = SERVICE.methods_by_name[rpc.name]
        assert rpc.request.DESCRIPTOR.full_name == method.input_type.full_name, rpc.name
        assert rpc.response.DESCRIPTOR.full_name == method.output_type.full_name, rpc.name
        streams = (method.client_streaming, method.server_streaming)
        expected = {
            rpcs.UnaryRpc: (False, False),
            rpcs.StreamUnaryRpc: (True, False),
            rpcs.UnaryStreamRpc: (False, True),
        }[type(rpc)]
        assert streams == expected, rpc.name


def test_only_the_event_feed_is_left_out() -> None:
    left_out = {m.name for m in SERVICE.methods} - {r.name for r in rpcs.ALL}
    assert left_out == {"WatchEvents"}  # events are for operators, not engines

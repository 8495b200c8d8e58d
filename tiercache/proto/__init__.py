"""Generated protobuf and gRPC stubs of the tiercache wire contract (package ``tiercache.v1``).

The source is ``proto/tiercache/proto/tiercache.proto`` at the repository root; ``python proto/generate.py``
regenerates ``tiercache_pb2*.py`` here (committed). A test fails when the committed stubs do not match it.
"""

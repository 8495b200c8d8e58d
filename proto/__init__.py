"""Generated protobuf and gRPC stubs of the tiercache wire contract (package ``tiercache.v1``).

``tiercache.proto`` is the source; ``generate.py`` regenerates ``tiercache_pb2*.py`` (committed). A test
fails when the committed stubs do not match the ``.proto``.
"""

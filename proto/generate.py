"""Regenerate the Python stubs of the wire contract (run: ``python proto/generate.py``).

The contract lives at ``proto/tiercache/proto/tiercache.proto``: its path under ``proto/`` is the import path
of the generated modules, so protoc (run with ``-I proto``) writes ``tiercache/proto/tiercache_pb2*.py`` and
the gRPC module imports its messages as ``tiercache.proto.tiercache_pb2`` — no staging, no renamed paths.

Primitives:
    generate: write ``tiercache_pb2.py``, ``tiercache_pb2.pyi`` and ``tiercache_pb2_grpc.py`` under a root
        (default: the repository root, i.e. into ``tiercache/proto/``).
    descriptor_set: the compiled FileDescriptorProto of the ``.proto`` (what the staleness test compares).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = Path("tiercache/proto/tiercache.proto")  # relative to HERE, which is protoc's include root
OUTPUTS = ("tiercache_pb2.py", "tiercache_pb2.pyi", "tiercache_pb2_grpc.py")


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # dev dependency (grpcio-tools)

    include = Path(protoc.__file__).resolve().parent / "_proto"
    code = protoc.main(["grpc_tools.protoc", f"-I{include}", f"-I{HERE}", *args])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")


def generate(root: Path = ROOT) -> list[Path]:
    """Compile the ``.proto`` into ``root/tiercache/proto/`` (the package ``tiercache.proto``)."""
    root.mkdir(parents=True, exist_ok=True)
    _protoc([f"--python_out={root}", f"--pyi_out={root}", f"--grpc_python_out={root}", str(SOURCE)])
    return [root / SOURCE.parent / name for name in OUTPUTS]


def descriptor_set() -> bytes:
    """The serialized FileDescriptorProto compiled from the ``.proto`` as it is now."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory() as tmp_name:
        out = Path(tmp_name) / "set.pb"
        _protoc([f"--descriptor_set_out={out}", str(SOURCE)])
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        return fds.file[0].SerializeToString()


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(f"wrote {path}")

"""Regenerate the Python stubs of ``proto/tiercache.proto`` (run: ``python proto/generate.py``).

The ``.proto`` is compiled as ``tiercache/proto/tiercache.proto`` so that the generated gRPC module imports
its messages as ``tiercache.proto.tiercache_pb2`` (the folder ``proto/`` is the package ``tiercache.proto``).

Primitives:
    generate: write ``tiercache_pb2.py``, ``tiercache_pb2.pyi`` and ``tiercache_pb2_grpc.py`` into a folder.
    descriptor_set: the compiled FileDescriptorProto of the ``.proto`` (what the staleness test compares).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "tiercache.proto"
_VIRTUAL = Path("tiercache/proto/tiercache.proto")
OUTPUTS = ("tiercache_pb2.py", "tiercache_pb2.pyi", "tiercache_pb2_grpc.py")


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # dev dependency (grpcio-tools)

    include = Path(protoc.__file__).resolve().parent / "_proto"
    code = protoc.main(["grpc_tools.protoc", f"-I{include}", *args])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")


def _staged(tmp: Path) -> Path:
    src = tmp / "src"
    (src / _VIRTUAL).parent.mkdir(parents=True)
    shutil.copyfile(PROTO, src / _VIRTUAL)
    return src


def generate(out_dir: Path = HERE) -> list[Path]:
    """Compile the ``.proto`` and copy the three generated modules into ``out_dir``."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        src, out = _staged(tmp), tmp / "out"
        out.mkdir()
        _protoc(
            [f"-I{src}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", str(_VIRTUAL)]
        )
        written = []
        for name in OUTPUTS:
            target = out_dir / name
            shutil.copyfile(out / _VIRTUAL.parent / name, target)
            written.append(target)
        return written


def descriptor_set() -> bytes:
    """The serialized FileDescriptorProto compiled from the ``.proto`` as it is now."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        src, out = _staged(tmp), tmp / "set.pb"
        _protoc([f"-I{src}", f"--descriptor_set_out={out}", str(_VIRTUAL)])
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        return fds.file[0].SerializeToString()


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(f"wrote {path}")

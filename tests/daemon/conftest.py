"""Fixtures of the daemon tests: real ``tiercache-daemon`` processes driven through the generated stubs.

The daemons are the harness plugin's (:mod:`tiercache.testing.plugin`: ``start_daemon``, ``shared_daemon``,
waited for until the health check says SERVING, stopped and cleaned up after) with this directory's options
(:data:`DAEMON_ARGS`); here are the test namespace, payloads and the RPC helpers the tests share.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from tiercache.fdpass import request_segment
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.shm import SharedSegment
from tiercache.testing.daemon import DaemonProcess as DaemonProc
from tiercache.testing.daemon import free_port
from tiercache.testing.plugin import SMALL_DAEMON_ARGS, make_daemon
from tiercache.testing.plugin import StartDaemon as StartDaemon  # the tests import it from here

RPC_TIMEOUT_S = 10.0
SLOT_BYTES = 64 << 10
MAX_MESSAGE_BYTES = 256 << 10
STREAM_CHUNK_BYTES = 12 << 10

# 4 layers x K|V x 16 tokens x 4 heads x 32 dims x bf16 = 32 KiB per chunk: pieces of 12K, 12K, 8K.
LAYOUT = KVLayout(
    num_layers=4, num_kv_heads=4, head_dim=32, dtype=KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16
)
NAMESPACE = Namespace(model_id="test/tiny", revision="r1", layout=LAYOUT, tokenizer_id="tok")


def namespace_spec(ns: Namespace = NAMESPACE) -> pb.NamespaceSpec:
    """The wire form of a namespace."""
    lay = ns.layout
    return pb.NamespaceSpec(
        model_id=ns.model_id,
        revision=ns.revision,
        tokenizer_id=ns.tokenizer_id,
        layout=pb.Layout(
            num_layers=lay.num_layers,
            num_kv_heads=lay.num_kv_heads,
            head_dim=lay.head_dim,
            dtype=pb.KV_DTYPE_BFLOAT16,
            chunk_tokens=lay.chunk_tokens,
            page_tokens=lay.page_tokens,
        ),
        tp_size=1,
        pp_size=1,
    )


def make_keys(n: int, seed: int) -> list[bytes]:
    """Keys of ``n`` chunks of a prompt that differs per seed."""
    tokens = [seed * 100_000 + t for t in range(n * LAYOUT.chunk_tokens)]
    return chunk_keys(NAMESPACE, tokens)


def payload(index: int, seed: int) -> bytes:
    """Deterministic chunk bytes: half random, half a repeating pattern (so that zstd has work to do)."""
    rng = np.random.default_rng(seed * 1000 + index)
    half = LAYOUT.chunk_bytes // 2
    noise = rng.integers(0, 256, size=half, dtype=np.uint8).tobytes()
    pattern = (bytes([index % 256, seed % 256]) * half)[:half]
    return noise + pattern


DAEMON_ARGS = (
    *SMALL_DAEMON_ARGS,
    "--max-message-bytes", str(MAX_MESSAGE_BYTES),
    "--stream-chunk-bytes", str(STREAM_CHUNK_BYTES),
    "--log-level", "DEBUG",
    "--diagnostics",
)  # fmt: skip
"""Options of this directory's daemons: small sizes, small messages and stream pieces, DEBUG logs, and the
Diagnostics echo service (off by default; several tests call it)."""


def base_args(tmp: Path, prefix: str, l3: Path) -> list[str]:
    """The whole command line (socket ``tmp/d.sock``) of a test daemon, for runs that must fail to start."""
    return ["--socket", str(tmp / "d.sock"), "--l3-path", str(l3), "--l2-prefix", prefix, *DAEMON_ARGS]


def new_daemon(root: Path, extra: Sequence[str] = (), prefix: str | None = None) -> DaemonProc:
    """A (not started) daemon with this directory's options and ``extra`` in ``root`` (L3 ``root/l3``)."""
    return make_daemon(root, [*DAEMON_ARGS, *extra], prefix=prefix)


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    """This directory's daemon options (see :data:`DAEMON_ARGS`)."""
    return DAEMON_ARGS


@pytest.fixture(scope="module")
def shared_daemon_args() -> tuple[str, ...]:
    """The module's shared daemon listens on TCP too and serves /metrics (both on free ports; no tokens, so
    both opened explicitly)."""
    return (
        "--metrics-port", str(free_port()), "--metrics-public",
        "--tcp", f"127.0.0.1:{free_port()}", "--allow-unauthenticated-tcp",
    )  # fmt: skip


@pytest.fixture(scope="module")
def stub(shared_daemon: DaemonProc) -> pb_grpc.KVCacheServiceStub:
    """A stub to the module's shared daemon."""
    return shared_daemon.stub()


@pytest.fixture(scope="module")
def reg(stub: pb_grpc.KVCacheServiceStub) -> pb.RegisterResponse:
    """The test namespace, registered once per module with the shared daemon."""
    return register(stub)


TENANT_A = (("authorization", "Bearer token-of-a"),)
"""Call metadata of tenant ``team-a`` of :func:`tenants_daemon`."""
TENANT_B = (("authorization", "Bearer token-of-b"),)
"""Call metadata of tenant ``team-b`` of :func:`tenants_daemon`."""


def write_tokens(path: Path) -> Path:
    """A tokens file of two tenants (``team-a``, ``team-b``; see TENANT_A and TENANT_B)."""
    path.write_text('[tokens]\n"token-of-a" = "team-a"\n"token-of-b" = "team-b"\n')
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def tenants_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """One daemon with authentication for a whole test module: tenants ``team-a`` and ``team-b``."""
    tmp = tmp_path_factory.mktemp("tenants")
    d = new_daemon(tmp, ["--tokens-file", str(write_tokens(tmp / "tokens.toml"))])
    try:
        yield d.start()
    finally:
        d.cleanup()


def register(
    stub: pb_grpc.KVCacheServiceStub, metadata: Sequence[tuple[str, str]] = ()
) -> pb.RegisterResponse:
    """Register the test namespace."""
    reply: pb.RegisterResponse = stub.Register(
        pb.RegisterRequest(namespace=namespace_spec(), engine_id="test"),
        timeout=RPC_TIMEOUT_S,
        metadata=metadata,
    )
    return reply


_GRANTED: dict[str, int] = {}
"""Descriptors of tenant pools received on a daemon's fd socket, by segment name (a grant is spent once)."""


def map_segment(reg: pb.RegisterResponse, metadata: Sequence[tuple[str, str]] = ()) -> SharedSegment:
    """Map the segment of a registration: by name, or (isolated data plane) by the descriptor the daemon
    hands out on its fd socket for the registration's grant and the caller's token."""
    dp = reg.data_plane
    if not dp.fd_socket:
        return SharedSegment.attach(dp.shm_segment)
    if dp.shm_segment not in _GRANTED:
        token = next((v.removeprefix("Bearer ") for k, v in metadata if k == "authorization"), None)
        _, fd = request_segment(dp.fd_socket, token, bytes(dp.fd_grant), RPC_TIMEOUT_S)
        _GRANTED[dp.shm_segment] = fd
    return SharedSegment.from_fd(dp.shm_segment, os.dup(_GRANTED[dp.shm_segment]))


def stream_store_messages(
    handle: bytes,
    keys: Sequence[bytes],
    chunks: Sequence[bytes],
    piece: int,
    zstd: bool = False,
    start_depth: int = 0,
    chain: Sequence[bytes] | None = None,
) -> Iterator[pb.StreamStoreMessage]:
    """The messages of a stream store of ``chunks`` in pieces of ``piece`` bytes; the first carries the handle
    and, when ``chain`` is given, names it as the stream's keys (None: an older client's stream, without)."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=3)
    first = True
    for i, (key, chunk) in enumerate(zip(keys, chunks)):
        for off in range(0, len(chunk), piece):
            data = chunk[off : off + piece]
            msg = pb.StreamStoreMessage(
                handle=handle if first else b"",
                start_depth=start_depth,
                key=key,
                index=i,
                offset=off,
                data=cctx.compress(data) if zstd else data,
                codec=pb.CODEC_ZSTD if zstd else pb.CODEC_RAW,
                last=off + piece >= len(chunk),
                chunk_bytes=len(chunk),
            )
            if first and chain is not None:
                msg.keys.extend(chain)
            first = False
            yield msg


def shm_store(
    stub: pb_grpc.KVCacheServiceStub,
    reg: pb.RegisterResponse,
    keys: Sequence[bytes],
    chunks: Sequence[bytes],
    metadata: Sequence[tuple[str, str]] = (),
) -> int:
    """Store chunks through shared memory (BeginStore, write the slots, CommitStore); returns stored."""
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=metadata
    )
    seg = map_segment(reg, metadata)
    try:
        slot_bytes = reg.data_plane.slot_bytes
        for ref in begin.slots:
            start = ref.slot * slot_bytes
            seg.buffer[start : start + ref.nbytes] = chunks[ref.index]
    finally:
        seg.close()
    commit = stub.CommitStore(
        pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id),
        timeout=RPC_TIMEOUT_S,
        metadata=metadata,
    )
    stored: int = commit.stored
    return stored


def shm_load(
    stub: pb_grpc.KVCacheServiceStub,
    reg: pb.RegisterResponse,
    keys: Sequence[bytes],
    metadata: Sequence[tuple[str, str]] = (),
) -> list[bytes]:
    """Load the cached prefix through shared memory (AcquireLoad, copy, ReleaseLoad)."""
    acq = stub.AcquireLoad(
        pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S, metadata=metadata
    )
    seg = map_segment(reg, metadata)
    try:
        slot_bytes = reg.data_plane.slot_bytes
        out = []
        for i, ref in enumerate(acq.slots):
            assert ref.index == i
            start = ref.slot * slot_bytes
            out.append(bytes(seg.buffer[start : start + ref.nbytes]))
    finally:
        seg.close()
        if acq.lease_id:
            rel = stub.ReleaseLoad(
                pb.ReleaseLoadRequest(handle=reg.handle, lease_id=acq.lease_id),
                timeout=RPC_TIMEOUT_S,
                metadata=metadata,
            )
            assert rel.released
    return out

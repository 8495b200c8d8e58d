"""Fixtures of the daemon tests: real ``tiercache-daemon`` processes driven through the generated stubs.

``start_daemon`` runs ``python -m tiercache.daemon`` with small sizes, waits (bounded) until the socket file
exists and the gRPC health check says SERVING, and at teardown stops it (SIGTERM, then SIGKILL) and removes
its socket and shared-memory segments.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiercache.fdpass import request_segment
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.shm import SHM_DIR, SharedSegment

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
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


@dataclass
class DaemonProc:
    """A running daemon process and how to reach it."""

    proc: subprocess.Popen[bytes]
    socket: str
    prefix: str
    l3_path: str
    log: Path
    args: list[str]
    channels: list[grpc.Channel] = field(default_factory=list)

    def channel(self) -> grpc.Channel:
        """A new channel to the daemon's socket (closed at teardown)."""
        ch = grpc.insecure_channel(
            "unix:" + self.socket,
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        self.channels.append(ch)
        return ch

    def stub(self) -> pb_grpc.KVCacheServiceStub:
        """A KVCacheService stub on a new channel."""
        return pb_grpc.KVCacheServiceStub(self.channel())

    def segments(self) -> list[Path]:
        """Shared-memory segments of this daemon's prefix."""
        return sorted(SHM_DIR.glob(f"{self.prefix}.*"))

    def stderr(self) -> str:
        """What the daemon logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        for ch in self.channels:
            ch.close()
        self.channels.clear()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=STOP_TIMEOUT_S)


def wait_serving(proc: subprocess.Popen[bytes], sock: str, log: Path) -> None:
    """Wait until the daemon's socket exists and its health check says SERVING (bounded)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            code = proc.wait(timeout=0.05)  # doubles as the pause between probes
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            raise AssertionError(
                f"daemon exited with {code} during start:\n{log.read_text(errors='replace')}"
            )
        if not os.path.exists(sock):
            continue
        with grpc.insecure_channel("unix:" + sock) as ch:
            try:
                reply = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1.0
                )
            except grpc.RpcError:
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
    raise AssertionError(
        f"daemon did not serve within {START_TIMEOUT_S}s:\n{log.read_text(errors='replace')}"
    )


def base_args(tmp: Path, prefix: str, l3: Path) -> list[str]:
    """The small-sized command line of a test daemon."""
    return [
        "--socket",
        str(tmp / "d.sock"),
        "--l2-bytes",
        "16M",
        "--slot-bytes",
        "64K",
        "--l3-path",
        str(l3),
        "--l3-bytes",
        "64M",
        "--l1-device",
        "cpu",
        "--l1-bytes",
        "1M",
        "--l2-prefix",
        prefix,
        "--max-message-bytes",
        str(MAX_MESSAGE_BYTES),
        "--stream-chunk-bytes",
        str(STREAM_CHUNK_BYTES),
        "--log-level",
        "DEBUG",
    ]


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


StartDaemon = Callable[..., DaemonProc]


def _spawn(tmp: Path, extra: Sequence[str], prefix: str, l3: Path, env: dict[str, str] | None) -> DaemonProc:
    args = [*base_args(tmp, prefix, l3), *extra]
    log = tmp / f"daemon-{secrets.token_hex(3)}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiercache.daemon", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    d = DaemonProc(proc, str(tmp / "d.sock"), prefix, str(l3), log, args)
    try:
        wait_serving(proc, d.socket, log)
    except BaseException:
        _cleanup(d)
        raise
    return d


def _cleanup(d: DaemonProc) -> None:
    for ch in d.channels:
        ch.close()
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()
    for seg in d.segments():
        seg.unlink(missing_ok=True)
    Path(d.socket).unlink(missing_ok=True)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[StartDaemon]:
    """A factory of daemon processes in ``tmp_path`` (same socket, prefix and L3 unless overridden)."""
    started: list[DaemonProc] = []
    prefix = f"tiercache-test-{secrets.token_hex(4)}"

    def start(*extra: str, env: dict[str, str] | None = None, l3: Path | None = None) -> DaemonProc:
        d = _spawn(tmp_path, extra, prefix, l3 or tmp_path / "l3", env)
        started.append(d)
        return d

    yield start
    for d in started:
        _cleanup(d)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """One daemon for a whole test module (also on TCP, with /metrics; both on free ports)."""
    tmp = tmp_path_factory.mktemp("daemon")
    d = _spawn(
        tmp,
        ["--metrics-port", str(free_port()), "--tcp", f"127.0.0.1:{free_port()}"],
        f"tiercache-test-{secrets.token_hex(4)}",
        tmp / "l3",
        None,
    )
    yield d
    _cleanup(d)


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
    tokens = write_tokens(tmp / "tokens.toml")
    d = _spawn(
        tmp, ["--tokens-file", str(tokens)], f"tiercache-test-{secrets.token_hex(4)}", tmp / "l3", None
    )
    yield d
    _cleanup(d)


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

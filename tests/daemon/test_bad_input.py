"""Bad input gets a clear status naming the problem; the daemon stays up and stored data stays intact."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from tests.daemon.conftest import (
    LAYOUT,
    MAX_MESSAGE_BYTES,
    RPC_TIMEOUT_S,
    DaemonProc,
    make_keys,
    namespace_spec,
    payload,
    register,
    shm_load,
    shm_store,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc

CB = LAYOUT.chunk_bytes
Stub = pb_grpc.KVCacheServiceStub


@pytest.fixture(scope="module")
def stub(shared_daemon: DaemonProc) -> Stub:
    return shared_daemon.stub()


@pytest.fixture(scope="module")
def reg(stub: Stub) -> pb.RegisterResponse:
    return register(stub)


@pytest.fixture(scope="module")
def baseline(stub: Stub, reg: pb.RegisterResponse) -> tuple[list[bytes], list[bytes]]:
    """Chunks stored before any bad input."""
    keys = make_keys(3, seed=7)
    chunks = [payload(i, seed=7) for i in range(3)]
    assert shm_store(stub, reg, keys, chunks) == 3
    return keys, chunks


def piece(
    handle: bytes,
    key: bytes,
    index: int,
    offset: int,
    data: bytes,
    last: bool,
    chunk_bytes: int = CB,
    codec: int = pb.CODEC_RAW,
) -> pb.StreamStoreMessage:
    return pb.StreamStoreMessage(
        handle=handle,
        key=key,
        index=index,
        offset=offset,
        data=data,
        last=last,
        chunk_bytes=chunk_bytes,
        codec=codec,
    )


def fails(call: Callable[[], object], code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    assert err.code() == code, (err.code(), err.details())
    details = err.details() or ""
    for fragment in fragments:
        assert fragment in details, details
    return details


def assert_intact(stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]) -> None:
    keys, chunks = baseline
    assert stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S).chunks == 3
    assert shm_load(stub, reg, keys) == chunks


CASES = ("chunk_bytes", "short", "long", "gap", "unfinished", "key", "zstd", "codec", "order", "interleaved")


def bad_streams(handle: bytes, seed: int) -> Iterator[tuple[str, list[pb.StreamStoreMessage], str]]:
    keys = make_keys(2, seed=seed)
    data = payload(0, seed=seed)
    yield "chunk_bytes", [piece(handle, keys[0], 0, 0, data, True, chunk_bytes=CB + 2)], "chunk_bytes: "
    yield (
        "short",
        [piece(handle, keys[0], 0, 0, data[:-5], True)],
        f"data: chunk index 0 ended at {CB - 5} bytes",
    )
    yield "long", [piece(handle, keys[0], 0, 0, data + b"xx", True)], "data: chunk index 0 overruns"
    yield (
        "gap",
        [piece(handle, keys[0], 0, 0, data[:100], False), piece(handle, keys[0], 0, 200, data[200:], True)],
        "offset: expected 100, got 200",
    )
    yield (
        "unfinished",
        [piece(handle, keys[0], 0, 0, data[:100], False)],
        "last: the stream ended inside chunk index 0",
    )
    yield "key", [piece(handle, b"k" * 5, 0, 0, data, True)], "key: must be 32 bytes, got 5"
    yield (
        "zstd",
        [piece(handle, keys[0], 0, 0, b"not zstd at all", True, codec=pb.CODEC_ZSTD)],
        "data: chunk index 0",
    )
    yield "codec", [piece(handle, keys[0], 0, 0, data, True, codec=9)], "codec: 9 is not a codec"
    yield (
        "order",
        [piece(handle, keys[0], 1, 0, data, True), piece(handle, keys[1], 0, 0, data, True)],
        "index: 0",
    )
    yield (
        "interleaved",
        [piece(handle, keys[0], 0, 0, data[:100], False), piece(handle, keys[1], 1, 0, data, True)],
        "key: message 1 is not a piece of chunk index 0",
    )


@pytest.mark.parametrize("case", CASES)
def test_bad_stream_store_is_refused_and_aborted(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]], case: str
) -> None:
    seed = 100 + CASES.index(case)
    _, messages, fragment = next(c for c in bad_streams(reg.handle, seed) if c[0] == case)
    fails(
        lambda: stub.StreamStore(iter(messages), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        fragment,
    )
    keys = make_keys(2, seed=seed)
    assert stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S).chunks == 0
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert stats.active_leases == 0
    assert_intact(stub, reg, baseline)
    # Nothing was left reserved: the same chunks store fine now.
    good = [piece(reg.handle, keys[0], 0, 0, payload(0, seed=seed), True)]
    assert stub.StreamStore(iter(good), timeout=RPC_TIMEOUT_S).stored == 1
    assert stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys[:1]), timeout=RPC_TIMEOUT_S).chunks == 1


def test_unregistered_and_malformed_handles(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    keys = baseline[0]
    fails(
        lambda: stub.Lookup(pb.LookupRequest(handle=b"\x01" * 16, keys=keys), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.NOT_FOUND,
        "handle: 01010101",
        "is not registered",
    )
    fails(
        lambda: stub.AcquireLoad(pb.AcquireLoadRequest(handle=b"abc", keys=keys), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "handle: must be the 16-byte handle Register returned, got 3 bytes",
    )
    fails(
        lambda: stub.StreamStore(
            iter([piece(b"\x02" * 16, keys[0], 0, 0, b"", True)]), timeout=RPC_TIMEOUT_S
        ),
        grpc.StatusCode.NOT_FOUND,
        "handle:",
    )
    assert_intact(stub, reg, baseline)


def test_malformed_key(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    keys = [baseline[0][0], b"short"]
    for call in (
        lambda: stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S),
        lambda: stub.BeginStore(pb.BeginStoreRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S),
        lambda: stub.AcquireLoad(pb.AcquireLoadRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S),
        lambda: list(
            stub.StreamLoad(pb.StreamLoadRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S)
        ),
    ):
        fails(call, grpc.StatusCode.INVALID_ARGUMENT, "keys[1]: must be 32 bytes, got 5")
    assert_intact(stub, reg, baseline)


def test_bad_namespaces(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    big = namespace_spec()
    big.layout.head_dim = 4096  # 4 MiB chunks, slots are 64 KiB
    fails(
        lambda: stub.Register(pb.RegisterRequest(namespace=big), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace.layout: chunks of 4194304 bytes do not fit",
    )
    no_dtype = namespace_spec()
    no_dtype.layout.dtype = pb.KV_DTYPE_UNSPECIFIED
    fails(
        lambda: stub.Register(pb.RegisterRequest(namespace=no_dtype), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace.layout.dtype: 0 is not a KV dtype",
    )
    odd = namespace_spec()
    odd.layout.page_tokens = 5
    fails(
        lambda: stub.Register(pb.RegisterRequest(namespace=odd), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace.layout.chunk_tokens: 16 is not a positive multiple of page_tokens=5",
    )
    rank = namespace_spec()
    rank.tp_rank = 3
    fails(
        lambda: stub.Register(pb.RegisterRequest(namespace=rank), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace.tp_rank: 3 not in [0, 1)",
    )
    fails(
        lambda: stub.Register(pb.RegisterRequest(), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace: is required",
    )
    nameless = namespace_spec()
    nameless.model_id = ""
    fails(
        lambda: stub.Register(pb.RegisterRequest(namespace=nameless), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "namespace.model_id:",
    )
    assert_intact(stub, reg, baseline)


def test_oversize_messages(
    stub: Stub, shared_daemon: DaemonProc, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    huge = b"x" * (MAX_MESSAGE_BYTES + 1024)
    diag = pb_grpc.DiagnosticsStub(shared_daemon.channel())
    fails(
        lambda: diag.Echo(pb.EchoMessage(data=huge), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    key = make_keys(1, seed=9)[0]
    fails(
        lambda: stub.StreamStore(iter([piece(reg.handle, key, 0, 0, huge, True)]), timeout=RPC_TIMEOUT_S),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    assert stub.Lookup(pb.LookupRequest(handle=reg.handle, keys=[key]), timeout=RPC_TIMEOUT_S).chunks == 0
    assert_intact(stub, reg, baseline)


def test_bad_tickets_leases_and_durations(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    keys = baseline[0]
    fails(
        lambda: stub.CommitStore(
            pb.CommitStoreRequest(handle=reg.handle, ticket_id=987654), timeout=RPC_TIMEOUT_S
        ),
        grpc.StatusCode.NOT_FOUND,
        "ticket_id: 987654",
    )
    assert not stub.AbortStore(
        pb.AbortStoreRequest(handle=reg.handle, ticket_id=987654), timeout=RPC_TIMEOUT_S
    ).aborted
    assert not stub.ReleaseLoad(
        pb.ReleaseLoadRequest(handle=reg.handle, lease_id=987654), timeout=RPC_TIMEOUT_S
    ).released
    fails(
        lambda: stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=reg.handle, keys=keys, ttl_s=-1), timeout=RPC_TIMEOUT_S
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ttl_s: must be a finite number of seconds >= 0",
    )
    fails(
        lambda: stub.Prefetch(
            pb.PrefetchRequest(handle=reg.handle, keys=keys, timeout_s=float("nan")), timeout=RPC_TIMEOUT_S
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "timeout_s:",
    )
    fails(
        lambda: stub.BeginStore(
            pb.BeginStoreRequest(handle=reg.handle, keys=[keys[0], keys[0]]), timeout=RPC_TIMEOUT_S
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "keys: a key appears twice",
    )
    fresh = make_keys(1, seed=10)
    assert shm_store(stub, reg, fresh, [payload(0, seed=10)]) == 1
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=make_keys(1, seed=11)), timeout=RPC_TIMEOUT_S
    )
    commit = pb.CommitStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id)
    assert stub.CommitStore(commit, timeout=RPC_TIMEOUT_S).stored == 1
    fails(lambda: stub.CommitStore(commit, timeout=RPC_TIMEOUT_S), grpc.StatusCode.NOT_FOUND, "ticket_id:")
    assert_intact(stub, reg, baseline)

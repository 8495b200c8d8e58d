"""Bad input gets a clear status naming the problem; the daemon stays up and stored data stays intact.

Every RPC that names a handle refuses a malformed, an unknown and another tenant's handle with the same
status, and every RPC refuses a call without a valid token, before its handler runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import grpc
import pytest

from tests.daemon.conftest import (
    LAYOUT,
    MAX_MESSAGE_BYTES,
    RPC_TIMEOUT_S,
    TENANT_A,
    TENANT_B,
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


def test_malformed_packed_keys(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    keys = baseline[0]
    packed = b"".join(keys)
    for request, fragment in (
        (
            pb.LookupRequest(handle=reg.handle, packed_keys=packed[:-5]),
            "packed_keys: 91 bytes is not a whole",
        ),
        (
            pb.LookupRequest(handle=reg.handle, packed_keys=packed, keys=keys),
            "packed_keys: a request sets keys or packed_keys, not both",
        ),
    ):
        fails(
            lambda r=request: stub.Lookup(r, timeout=RPC_TIMEOUT_S),
            grpc.StatusCode.INVALID_ARGUMENT,
            fragment,
        )
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


def test_lifetimes_above_the_cap_are_refused(
    stub: Stub, reg: pb.RegisterResponse, baseline: tuple[list[bytes], list[bytes]]
) -> None:
    """A lease, ticket or claim asked for longer than ``--max-ttl-s`` (default 300 s) is refused, not
    shortened, and holds nothing; at the cap it is granted in full."""
    keys, fresh = baseline[0], make_keys(2, seed=12)
    too_long = "ttl_s: must be at most max_ttl_s = 300 seconds, got 1000000000.0"
    for call in (
        lambda: stub.AcquireLoad(
            pb.AcquireLoadRequest(handle=reg.handle, keys=keys, ttl_s=1e9), timeout=RPC_TIMEOUT_S
        ),
        lambda: stub.BeginStore(
            pb.BeginStoreRequest(handle=reg.handle, keys=fresh, ttl_s=1e9), timeout=RPC_TIMEOUT_S
        ),
        lambda: stub.ClaimPrefill(
            pb.ClaimPrefillRequest(handle=reg.handle, keys=fresh, ttl_s=1e9), timeout=RPC_TIMEOUT_S
        ),
    ):
        fails(call, grpc.StatusCode.INVALID_ARGUMENT, too_long)
    claim = stub.ClaimPrefill(
        pb.ClaimPrefillRequest(handle=reg.handle, keys=fresh, ttl_s=300), timeout=RPC_TIMEOUT_S
    )
    assert (claim.cached, claim.wait, claim.lead) == (0, 0, 2)  # the refused claim left nothing claimed
    release = pb.ReleasePrefillRequest(handle=reg.handle, claim_id=claim.claim_id)
    assert stub.ReleasePrefill(release, timeout=RPC_TIMEOUT_S).released == 2
    begin = stub.BeginStore(
        pb.BeginStoreRequest(handle=reg.handle, keys=fresh, ttl_s=300), timeout=RPC_TIMEOUT_S
    )
    assert len(begin.slots) == 2 and 0 < begin.expires_in_s <= 300
    abort = pb.AbortStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id)
    assert stub.AbortStore(abort, timeout=RPC_TIMEOUT_S).aborted
    lease = stub.AcquireLoad(
        pb.AcquireLoadRequest(handle=reg.handle, keys=keys, ttl_s=300), timeout=RPC_TIMEOUT_S
    )
    assert lease.lease_id != 0
    release_load = pb.ReleaseLoadRequest(handle=reg.handle, lease_id=lease.lease_id)
    assert stub.ReleaseLoad(release_load, timeout=RPC_TIMEOUT_S).released
    assert_intact(stub, reg, baseline)


# ------------------------------------------------------------------ the handle check of every RPC, and auth

Metadata = Sequence[tuple[str, str]]
T = RPC_TIMEOUT_S
KEYS = make_keys(2, seed=300)


def _stream_store(kv: Stub, handle: bytes, md: Metadata) -> object:
    return kv.StreamStore(
        iter([piece(handle, KEYS[0], 0, 0, payload(0, seed=300), True)]), timeout=T, metadata=md
    )


HANDLE_CALLS: dict[str, Callable[[Stub, bytes, Metadata], object]] = {
    "Lookup": lambda kv, h, md: kv.Lookup(pb.LookupRequest(handle=h, keys=KEYS), timeout=T, metadata=md),
    "Prefetch": lambda kv, h, md: kv.Prefetch(
        pb.PrefetchRequest(handle=h, keys=KEYS), timeout=T, metadata=md
    ),
    "CancelPrefetch": lambda kv, h, md: kv.CancelPrefetch(
        pb.CancelPrefetchRequest(handle=h, prefetch_id=1), timeout=T, metadata=md
    ),
    "BeginStore": lambda kv, h, md: kv.BeginStore(
        pb.BeginStoreRequest(handle=h, keys=KEYS), timeout=T, metadata=md
    ),
    "CommitStore": lambda kv, h, md: kv.CommitStore(
        pb.CommitStoreRequest(handle=h, ticket_id=1), timeout=T, metadata=md
    ),
    "AbortStore": lambda kv, h, md: kv.AbortStore(
        pb.AbortStoreRequest(handle=h, ticket_id=1), timeout=T, metadata=md
    ),
    "AcquireLoad": lambda kv, h, md: kv.AcquireLoad(
        pb.AcquireLoadRequest(handle=h, keys=KEYS), timeout=T, metadata=md
    ),
    "ReleaseLoad": lambda kv, h, md: kv.ReleaseLoad(
        pb.ReleaseLoadRequest(handle=h, lease_id=1), timeout=T, metadata=md
    ),
    "ClaimPrefill": lambda kv, h, md: kv.ClaimPrefill(
        pb.ClaimPrefillRequest(handle=h, keys=KEYS), timeout=T, metadata=md
    ),
    "WaitPrefill": lambda kv, h, md: kv.WaitPrefill(
        pb.WaitPrefillRequest(handle=h, keys=KEYS), timeout=T, metadata=md
    ),
    "ReleasePrefill": lambda kv, h, md: kv.ReleasePrefill(
        pb.ReleasePrefillRequest(handle=h, claim_id=1), timeout=T, metadata=md
    ),
    "ReportUsage": lambda kv, h, md: kv.ReportUsage(pb.ReportUsageRequest(handle=h), timeout=T, metadata=md),
    "Pin": lambda kv, h, md: kv.Pin(pb.PinRequest(handle=h, keys=KEYS), timeout=T, metadata=md),
    "Unpin": lambda kv, h, md: kv.Unpin(pb.PinRequest(handle=h, keys=KEYS), timeout=T, metadata=md),
    "Purge": lambda kv, h, md: kv.Purge(pb.PurgeRequest(handle=h), timeout=T, metadata=md),
    "StreamLoad": lambda kv, h, md: list(
        kv.StreamLoad(pb.StreamLoadRequest(handle=h, keys=KEYS), timeout=T, metadata=md)
    ),
    "StreamStore": _stream_store,
}
"""Every KVCacheService RPC whose request names a handle (StreamStore: in its first message), called with
otherwise valid requests."""

TENANT_CALLS: dict[str, Callable[[Stub, pb_grpc.DiagnosticsStub, Metadata], object]] = {
    "Register": lambda kv, diag, md: kv.Register(
        pb.RegisterRequest(namespace=namespace_spec()), timeout=T, metadata=md
    ),
    "Stats": lambda kv, diag, md: kv.Stats(pb.StatsRequest(), timeout=T, metadata=md),
    "WatchEvents": lambda kv, diag, md: list(kv.WatchEvents(pb.WatchEventsRequest(), timeout=T, metadata=md)),
    "Echo": lambda kv, diag, md: diag.Echo(pb.EchoMessage(data=b"x"), timeout=T, metadata=md),
    "EchoStream": lambda kv, diag, md: list(
        diag.EchoStream(iter([pb.EchoMessage(data=b"x")]), timeout=T, metadata=md)
    ),
    "SinkStream": lambda kv, diag, md: diag.SinkStream(
        iter([pb.EchoMessage(data=b"x")]), timeout=T, metadata=md
    ),
    "SourceStream": lambda kv, diag, md: list(
        diag.SourceStream(pb.SourceRequest(message_bytes=1, count=1), timeout=T, metadata=md)
    ),
}
"""The RPCs that take no handle."""


def _methods(service: str) -> dict[str, bool]:
    """Method name -> whether its request message has a ``handle`` field."""
    desc = pb.DESCRIPTOR.services_by_name[service]
    return {m.name: "handle" in m.input_type.fields_by_name for m in desc.methods}


def test_the_tables_cover_every_rpc() -> None:
    kv = _methods("KVCacheService")
    assert set(HANDLE_CALLS) == {name for name, has_handle in kv.items() if has_handle}
    assert set(TENANT_CALLS) == {name for name, has_handle in kv.items() if not has_handle} | set(
        _methods("Diagnostics")
    )


@pytest.fixture(scope="module")
def tenant_stub(tenants_daemon: DaemonProc) -> Stub:
    return tenants_daemon.stub()


@pytest.fixture(scope="module")
def reg_a(tenant_stub: Stub) -> pb.RegisterResponse:
    return register(tenant_stub, TENANT_A)


@pytest.fixture(scope="module")
def stored_a(tenant_stub: Stub, reg_a: pb.RegisterResponse) -> tuple[list[bytes], list[bytes]]:
    """Chunks tenant A stored before any refused call (under KEYS, which every call names)."""
    chunks = [payload(i, seed=300) for i in range(len(KEYS))]
    assert shm_store(tenant_stub, reg_a, KEYS, chunks, TENANT_A) == len(KEYS)
    return KEYS, chunks


def assert_a_intact(stub: Stub, reg_a: pb.RegisterResponse, stored: tuple[list[bytes], list[bytes]]) -> None:
    keys, chunks = stored
    lookup = stub.Lookup(pb.LookupRequest(handle=reg_a.handle, keys=keys), timeout=T, metadata=TENANT_A)
    assert lookup.chunks == len(keys)
    assert shm_load(stub, reg_a, keys, TENANT_A) == chunks
    stats = stub.Stats(pb.StatsRequest(), timeout=T, metadata=TENANT_A)
    assert stats.active_leases == 0


BAD_HANDLES: dict[str, tuple[grpc.StatusCode, Callable[[bytes], bytes], Callable[[bytes], str]]] = {
    "malformed": (
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda own: b"abc",
        lambda h: "handle: must be the 16-byte handle Register returned, got 3 bytes",
    ),
    "unknown": (
        grpc.StatusCode.NOT_FOUND,
        lambda own: b"\x01" * 16,
        lambda h: f"handle: {h.hex()} is not registered",
    ),
    "foreign": (  # the answer of an unknown handle: another tenant's namespaces are not B's to learn
        grpc.StatusCode.NOT_FOUND,
        lambda own: own,
        lambda h: f"handle: {h.hex()} is not registered",
    ),
}
"""Case -> (status, the handle tenant B sends given tenant A's, the message that names it)."""


@pytest.mark.parametrize("case", sorted(BAD_HANDLES))
@pytest.mark.parametrize("rpc", sorted(HANDLE_CALLS))
def test_every_handle_rpc_refuses_a_bad_handle_with_one_status(
    tenant_stub: Stub,
    reg_a: pb.RegisterResponse,
    stored_a: tuple[list[bytes], list[bytes]],
    rpc: str,
    case: str,
) -> None:
    code, handle_of, message_of = BAD_HANDLES[case]
    handle = handle_of(reg_a.handle)
    fails(lambda: HANDLE_CALLS[rpc](tenant_stub, handle, TENANT_B), code, message_of(handle))
    assert_a_intact(tenant_stub, reg_a, stored_a)


NO_TOKEN: dict[str, tuple[Metadata, str]] = {
    "missing": ((), "authorization: missing"),
    "unknown": ((("authorization", "Bearer not-a-token"),), "authorization: unknown token"),
    "malformed": ((("authorization", "Basic abc"),), "authorization: expected 'Bearer <token>'"),
}


@pytest.mark.parametrize("token", sorted(NO_TOKEN))
@pytest.mark.parametrize("rpc", sorted(HANDLE_CALLS))
def test_every_handle_rpc_refuses_a_call_without_a_valid_token(
    tenant_stub: Stub,
    reg_a: pb.RegisterResponse,
    stored_a: tuple[list[bytes], list[bytes]],
    rpc: str,
    token: str,
) -> None:
    """With the tenant's own handle, but no valid token: refused, and nothing the handler would do is done
    (a Purge would remove A's chunks, a BeginStore reserve, an AcquireLoad lease)."""
    metadata, message = NO_TOKEN[token]
    fails(
        lambda: HANDLE_CALLS[rpc](tenant_stub, reg_a.handle, metadata),
        grpc.StatusCode.UNAUTHENTICATED,
        message,
    )
    assert_a_intact(tenant_stub, reg_a, stored_a)


@pytest.mark.parametrize("token", sorted(NO_TOKEN))
@pytest.mark.parametrize("rpc", sorted(TENANT_CALLS))
def test_every_rpc_without_a_handle_refuses_a_call_without_a_valid_token(
    tenants_daemon: DaemonProc, tenant_stub: Stub, rpc: str, token: str
) -> None:
    metadata, message = NO_TOKEN[token]
    diag = pb_grpc.DiagnosticsStub(tenants_daemon.channel())
    namespaces = tenant_stub.Stats(pb.StatsRequest(), timeout=T, metadata=TENANT_B).namespaces
    fails(lambda: TENANT_CALLS[rpc](tenant_stub, diag, metadata), grpc.StatusCode.UNAUTHENTICATED, message)
    # A refused Register registers nothing.
    assert tenant_stub.Stats(pb.StatsRequest(), timeout=T, metadata=TENANT_B).namespaces == namespaces

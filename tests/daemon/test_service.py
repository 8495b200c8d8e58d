"""A real daemon process driven through the generated stubs: register, lookup, shared-memory and byte-stream
stores and loads (bit-exact), prefetch, pin, events, stats, health, diagnostics, socket mode, /metrics."""

from __future__ import annotations

import os
import queue
import stat
import threading
import urllib.request
from collections.abc import Sequence

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.daemon.conftest import (
    LAYOUT,
    NAMESPACE,
    RPC_TIMEOUT_S,
    SLOT_BYTES,
    STREAM_CHUNK_BYTES,
    DaemonProc,
    make_keys,
    namespace_spec,
    payload,
    register,
    shm_load,
    shm_store,
    stream_store_messages,
)
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.shm import SHM_DIR
from tiercache.tiers.published import index_bytes, index_entries

L2 = pb.TIER_L2


def by_tier(reply: pb.LookupResponse) -> dict[int, int]:
    return {t.tier: t.chunks for t in reply.by_tier}


def lookup(stub: pb_grpc.KVCacheServiceStub, handle: bytes, keys: Sequence[bytes]) -> pb.LookupResponse:
    reply: pb.LookupResponse = stub.Lookup(pb.LookupRequest(handle=handle, keys=keys), timeout=RPC_TIMEOUT_S)
    return reply


def stream_load(
    stub: pb_grpc.KVCacheServiceStub,
    handle: bytes,
    keys: Sequence[bytes],
    zstd: bool,
    max_message_bytes: int = 0,
) -> tuple[list[bytes], list[pb.StreamLoadMessage]]:
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    messages = list(
        stub.StreamLoad(
            pb.StreamLoadRequest(
                handle=handle,
                keys=keys,
                codec=pb.CODEC_ZSTD if zstd else pb.CODEC_RAW,
                max_message_bytes=max_message_bytes,
            ),
            timeout=RPC_TIMEOUT_S,
        )
    )
    chunks: dict[int, bytearray] = {}
    for m in messages:
        data = dctx.decompress(m.data) if m.codec == pb.CODEC_ZSTD else m.data
        buf = chunks.setdefault(m.index, bytearray())
        assert m.offset == len(buf) and m.chunk_bytes == LAYOUT.chunk_bytes and m.key == keys[m.index]
        buf += data
    for i, m in enumerate(messages):
        assert m.last == (i == len(messages) - 1 or messages[i + 1].index != m.index)
    return [bytes(chunks[i]) for i in sorted(chunks)], messages


def test_register_describes_layout_and_data_plane(
    stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse
) -> None:
    assert len(reg.handle) == 16
    assert reg.handle == NAMESPACE.scoped_id("")  # the default tenant's namespace id
    assert reg.chunk_bytes == LAYOUT.chunk_bytes
    assert reg.layout == namespace_spec().layout
    dp = reg.data_plane
    assert dp.slot_bytes == SLOT_BYTES and dp.num_slots == (16 << 20) // SLOT_BYTES
    assert dp.segment_bytes == dp.slot_bytes * dp.num_slots + index_bytes(dp.index_entries)  # pages, index
    assert dp.index_entries == index_entries(dp.num_slots)
    assert (SHM_DIR / dp.shm_segment).stat().st_size == dp.segment_bytes
    assert reg.lease_ttl_s == 30.0 and reg.max_stream_message_bytes == STREAM_CHUNK_BYTES
    assert register(stub).handle == reg.handle  # idempotent


def test_shared_memory_store_and_load_are_bit_exact(
    stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse
) -> None:
    keys = make_keys(3, seed=1)
    chunks = [payload(i, seed=1) for i in range(3)]
    assert lookup(stub, reg.handle, keys).chunks == 0
    assert shm_store(stub, reg, keys, chunks) == 3
    found = lookup(stub, reg.handle, keys)
    assert found.chunks == 3 and by_tier(found)[L2] == 3
    assert shm_load(stub, reg, keys) == chunks
    # A prefix of a longer chain; a store of cached chunks skips them.
    longer = make_keys(5, seed=1)
    assert lookup(stub, reg.handle, longer).chunks == 3
    begin = stub.BeginStore(pb.BeginStoreRequest(handle=reg.handle, keys=longer), timeout=RPC_TIMEOUT_S)
    assert list(begin.skipped) == [0, 1, 2] and [s.index for s in begin.slots] == [3, 4]
    assert begin.expires_in_s > 0
    aborted = stub.AbortStore(
        pb.AbortStoreRequest(handle=reg.handle, ticket_id=begin.ticket_id), timeout=RPC_TIMEOUT_S
    )
    assert aborted.aborted
    assert lookup(stub, reg.handle, longer).chunks == 3


@pytest.mark.parametrize("zstd", [False, True], ids=["raw", "zstd"])
def test_byte_stream_store_and_load_round_trip(
    stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse, zstd: bool
) -> None:
    seed = 20 + zstd
    keys = make_keys(3, seed=seed)
    chunks = [payload(i, seed=seed) for i in range(3)]
    reply = stub.StreamStore(
        stream_store_messages(reg.handle, keys, chunks, piece=10_000, zstd=zstd), timeout=RPC_TIMEOUT_S
    )
    assert reply.stored == 3 and list(reply.skipped) == []
    assert by_tier(lookup(stub, reg.handle, keys))[L2] == 3
    loaded, messages = stream_load(stub, reg.handle, keys, zstd)
    assert loaded == chunks
    assert all(len(m.data) <= STREAM_CHUNK_BYTES for m in messages)
    assert any(m.codec == pb.CODEC_ZSTD for m in messages) == zstd
    # The client may ask for smaller messages; what is stored through the stream loads through shm too.
    small, messages = stream_load(stub, reg.handle, keys, zstd, max_message_bytes=5000)
    assert small == chunks and all(len(m.data) <= 5000 for m in messages if m.codec == pb.CODEC_RAW)
    assert shm_load(stub, reg, keys) == chunks


def test_stream_store_skips_cached_chunks(stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse) -> None:
    keys = make_keys(3, seed=30)
    chunks = [payload(i, seed=30) for i in range(3)]
    assert shm_store(stub, reg, keys[:2], chunks[:2]) == 2
    reply = stub.StreamStore(
        stream_store_messages(reg.handle, keys, chunks, piece=LAYOUT.chunk_bytes, zstd=False),
        timeout=RPC_TIMEOUT_S,
    )
    assert reply.stored == 1 and list(reply.skipped) == [0, 1]
    assert stream_load(stub, reg.handle, keys, zstd=False)[0] == chunks


def test_packed_keys_look_up_and_count_as_repeated_keys(
    stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse
) -> None:
    """A Lookup with its keys packed into one field answers and counts exactly as one with repeated keys
    (short chains and chains long enough for the numpy path, a gap, prefetch)."""
    assert reg.packed_keys  # the daemon says it reads them
    keys = make_keys(40, seed=45)
    shm_store(stub, reg, keys[:36], [payload(i, seed=45) for i in range(36)])
    chains = [keys[:3], keys, keys[:36] + make_keys(1, seed=46) + keys[37:], keys[5:], [], keys[:1]]

    def hit_tokens() -> int:  # counted by the fastest tier holding each chunk: L2 here, all along
        return sum(t.lookup_hit_tokens for t in stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S).tiers)

    counted_of: dict[int, int] = {}
    for chain in chains:
        for prefetch in (False, True):
            before = hit_tokens()
            plain = stub.Lookup(
                pb.LookupRequest(handle=reg.handle, keys=chain, prefetch=prefetch), timeout=RPC_TIMEOUT_S
            )
            counted = hit_tokens() - before
            packed = stub.Lookup(
                pb.LookupRequest(handle=reg.handle, packed_keys=b"".join(chain), prefetch=prefetch),
                timeout=RPC_TIMEOUT_S,
            )
            assert hit_tokens() - before == 2 * counted
            after = lookup(stub, reg.handle, chain)  # L3's count grows while the write-down goes on
            assert packed.chunks == plain.chunks == after.chunks, len(chain)
            for tier, n in by_tier(packed).items():
                assert (
                    (by_tier(plain)[tier] <= n <= by_tier(after)[tier])
                    if tier == pb.TIER_L3
                    else (by_tier(plain)[tier] == n)
                ), (len(chain), tier)
            counted_of[len(chain)] = counted
    assert counted_of[40] == 36 * LAYOUT.chunk_tokens and counted_of[35] == 31 * LAYOUT.chunk_tokens


def test_prefetch_lookup_pin_stats(stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse) -> None:
    keys = make_keys(2, seed=40)
    shm_store(stub, reg, keys, [payload(i, seed=40) for i in range(2)])
    ready = stub.Prefetch(
        pb.PrefetchRequest(handle=reg.handle, keys=keys, timeout_s=5), timeout=RPC_TIMEOUT_S
    )
    assert ready.ready == 2
    assert (
        stub.Lookup(
            pb.LookupRequest(handle=reg.handle, keys=keys, prefetch=True), timeout=RPC_TIMEOUT_S
        ).chunks
        == 2
    )
    assert stub.Pin(pb.PinRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S).chunks == 2
    assert stub.Unpin(pb.PinRequest(handle=reg.handle, keys=keys), timeout=RPC_TIMEOUT_S).chunks == 2
    assert stub.Pin(pb.PinRequest(handle=reg.handle), timeout=RPC_TIMEOUT_S).chunks >= 2  # whole namespace
    stub.Unpin(pb.PinRequest(handle=reg.handle), timeout=RPC_TIMEOUT_S)
    stats = stub.Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert [t.tier for t in stats.tiers] == [pb.TIER_L1, pb.TIER_L2, pb.TIER_L3]
    l2 = stats.tiers[1]
    assert l2.chunks >= 2 and l2.capacity_bytes == 16 << 20 and l2.hits > 0
    assert stats.namespaces >= 1 and stats.active_leases == 0


def test_watch_events_stored_then_cleared(shared_daemon: DaemonProc) -> None:
    stub = shared_daemon.stub()
    spec = namespace_spec()
    spec.cache_salt = "events"
    reg = stub.Register(pb.RegisterRequest(namespace=spec), timeout=RPC_TIMEOUT_S)
    keys = make_keys(2, seed=50)
    chunks = [payload(i, seed=50) for i in range(2)]
    received: queue.Queue[pb.CacheEvent | BaseException] = queue.Queue()
    call = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=2**62))  # live events only

    def collect() -> None:
        try:
            for event in call:
                received.put(event)
        except grpc.RpcError as exc:
            received.put(exc)

    threading.Thread(target=collect, daemon=True).start()
    call.initial_metadata()  # sent once the subscription is live
    try:
        assert shm_store(stub, reg, keys, chunks) == 2
        purged = stub.Purge(pb.PurgeRequest(handle=reg.handle), timeout=RPC_TIMEOUT_S)
        assert purged.removed == 2
        mine: list[pb.CacheEvent] = []
        while not mine or mine[-1].kind != pb.CacheEvent.KIND_CLEARED:
            item = received.get(timeout=RPC_TIMEOUT_S)
            assert not isinstance(item, BaseException), item
            if item.handle == reg.handle:
                mine.append(item)
    finally:
        call.cancel()
    stored = [e for e in mine if e.kind == pb.CacheEvent.KIND_STORED and e.tier == L2]
    removed = [e for e in mine if e.kind == pb.CacheEvent.KIND_REMOVED]
    assert sorted(e.key for e in stored) == sorted(keys)
    assert {e.key for e in removed} == set(keys) and not any(e.evicted for e in removed)
    sequences = [e.sequence for e in mine]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    assert mine[-1].kind == pb.CacheEvent.KIND_CLEARED and mine[-1].tier == pb.TIER_UNSPECIFIED
    assert lookup(stub, reg.handle, keys).chunks == 0
    # Replay: a subscriber resuming after the first event gets the rest, in order, from the buffer.
    replay = stub.WatchEvents(pb.WatchEventsRequest(after_sequence=sequences[0]))
    try:
        again = []
        for event in replay:
            if event.handle == reg.handle:
                again.append(event.sequence)
            if event.sequence == sequences[-1]:
                break
    finally:
        replay.cancel()
    assert again == sequences[1:]


def test_health_and_diagnostics(shared_daemon: DaemonProc) -> None:
    channel = shared_daemon.channel()
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tiercache.v1.KVCacheService"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    diag = pb_grpc.DiagnosticsStub(channel)
    assert diag.Echo(pb.EchoMessage(data=b"ping"), timeout=RPC_TIMEOUT_S).data == b"ping"
    echoed = [m.data for m in diag.EchoStream(iter([pb.EchoMessage(data=b"a"), pb.EchoMessage(data=b"bc")]))]
    assert echoed == [b"a", b"bc"]


def test_one_way_diagnostic_streams(shared_daemon: DaemonProc) -> None:
    diag = pb_grpc.DiagnosticsStub(shared_daemon.channel())
    sent = [pb.EchoMessage(data=b"a" * 1000), pb.EchoMessage(data=b""), pb.EchoMessage(data=b"bc")]
    summary = diag.SinkStream(iter(sent), timeout=RPC_TIMEOUT_S)
    assert (summary.messages, summary.bytes) == (3, 1002)
    got = list(diag.SourceStream(pb.SourceRequest(message_bytes=300, count=3), timeout=RPC_TIMEOUT_S))
    assert [m.data for m in got] == [(bytes(range(256)) + bytes(range(44)))] * 3
    for request, field in [
        (pb.SourceRequest(message_bytes=0, count=1), "message_bytes"),
        (pb.SourceRequest(message_bytes=1 << 30, count=1), "message_bytes"),
        (pb.SourceRequest(message_bytes=1, count=1 << 40), "count"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            list(diag.SourceStream(request, timeout=RPC_TIMEOUT_S))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in str(err.value.details())


def test_socket_file_mode_is_0600(shared_daemon: DaemonProc) -> None:
    mode = os.stat(shared_daemon.socket).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_metrics_endpoint(
    shared_daemon: DaemonProc, stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse
) -> None:
    keys = make_keys(1, seed=60)
    shm_store(stub, reg, keys, [payload(0, seed=60)])
    shm_load(stub, reg, keys)
    port = shared_daemon.args[shared_daemon.args.index("--metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=RPC_TIMEOUT_S) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    for fragment in (
        'tiercache_tier_chunks{tier="L2"}',
        'tiercache_tier_capacity_bytes{tier="L3"} 6.7108864e+07',
        'tiercache_tier_hits_total{tier="L2"}',
        'tiercache_tier_misses_total{tier="L1"}',
        'tiercache_tier_evictions_total{tier="L2"}',
        'tiercache_tier_promotions_total{tier="L1"}',
        'tiercache_tier_corrupt_reads_total{tier="L3"}',
        "tiercache_active_leases 0.0",
        'tiercache_rpc_duration_seconds_bucket{code="OK",le="0.1",method="CommitStore"}',
        'tiercache_bytes_moved_total{direction="store",path="shm"}',
        'tiercache_bytes_moved_total{direction="load",path="shm"}',
        'tiercache_lookup_hit_tokens_total{tier="L2"}',
        'tiercache_load_success_tokens_total{tier="L2"}',
    ):
        assert fragment in text, fragment
    assert "python_gc_objects_collected_total" not in text  # its own registry, not the global one


def _moved_bytes(shared_daemon: DaemonProc, direction: str, path: str) -> float:
    port = shared_daemon.args[shared_daemon.args.index("--metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=RPC_TIMEOUT_S) as resp:
        text = resp.read().decode()
    name = f'tiercache_bytes_moved_total{{direction="{direction}",path="{path}"}} '
    return sum(float(line[len(name) :]) for line in text.splitlines() if line.startswith(name))


def test_stream_bytes_are_counted_once_per_stream(
    shared_daemon: DaemonProc, stub: pb_grpc.KVCacheServiceStub, reg: pb.RegisterResponse
) -> None:
    keys = make_keys(3, seed=61)
    chunks = [payload(i, seed=61) for i in range(3)]
    stored_before = _moved_bytes(shared_daemon, "store", "stream")
    reply = stub.StreamStore(
        stream_store_messages(reg.handle, keys, chunks, piece=10_000, zstd=False), timeout=RPC_TIMEOUT_S
    )
    assert reply.stored == 3
    loaded_before = _moved_bytes(shared_daemon, "load", "stream")
    assert stream_load(stub, reg.handle, keys[:2], zstd=False)[0] == chunks[:2]
    assert _moved_bytes(shared_daemon, "store", "stream") - stored_before == 3 * LAYOUT.chunk_bytes
    assert _moved_bytes(shared_daemon, "load", "stream") - loaded_before == 2 * LAYOUT.chunk_bytes


def test_tcp_listener(shared_daemon: DaemonProc) -> None:
    address = shared_daemon.args[shared_daemon.args.index("--tcp") + 1]
    with grpc.insecure_channel(address) as channel:
        stats = pb_grpc.KVCacheServiceStub(channel).Stats(pb.StatsRequest(), timeout=RPC_TIMEOUT_S)
    assert len(stats.tiers) == 3
    assert f"listening on unix:{shared_daemon.socket} and tcp:{address}" in shared_daemon.stderr()

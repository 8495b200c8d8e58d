"""End to end: engine processes, the connector and a real ``tiercache.daemon`` process.

Every bit-exactness check compares against the source KV regenerated from a seed (``engine_proc.py``).
No test asserts wall-clock timings; waits are bounded loops on observable state.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from tiercache.connector import (
    ClientConfig,
    Codec,
    ConnectorConfig,
    ContiguousKV,
    DataPlaneMode,
    KVConnector,
    TierCacheClient,
    TierLevel,
)
from tiercache.connector.channel import ChannelConfig, auth_metadata, open_channel, parse_address
from tiercache.connector.errors import error_from_rpc
from tiercache.errors import NotFoundError, PermissionDeniedError, UnavailableError
from tiercache.keys import chunk_keys
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto.tiercache_pb2_grpc import KVCacheServiceStub
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon (conftest modules are not importable here)

WAIT_S = 30.0
TOKENS = 64 + 5  # four full chunks and a partial one (never keyed)
FULL = 64

RunEngine = Callable[..., dict[str, Any]]


def _connector(
    address: str, engine: ModuleType, token: str | None = None, salt: str = "", **cfg: Any
) -> KVConnector:
    client = TierCacheClient.connect(address, token=token, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, engine.namespace(salt), ConnectorConfig(**cfg))


def _mode(remote: bool) -> DataPlaneMode:
    return DataPlaneMode.STREAM if remote else DataPlaneMode.AUTO


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_two_engine_processes_share_a_prefix(
    daemon: Daemon, run_engine: RunEngine, engine_mod: ModuleType, paged: bool
) -> None:
    common = {"address": daemon.address, "seed": 1, "tokens": TOKENS, "paged": paged}
    stored = run_engine(mode="store", **common)
    assert stored == {"stored": FULL, "skipped": 0, "remote": False}
    again = run_engine(mode="store", **common)
    assert again == {"stored": 0, "skipped": FULL, "remote": False}
    loaded = run_engine(mode="load", **common)
    assert loaded["loaded"] == loaded["hit"] == FULL and not loaded["remote"]
    assert loaded["exact"]
    assert loaded["digest"] == engine_mod.digest(engine_mod.token_major(1, TOKENS), FULL)
    other = run_engine(mode="load", **{**common, "seed": 2})
    assert other["loaded"] == 0 and other["hit"] == 0


@pytest.mark.parametrize("call_while_down", [True, False], ids=["seen-down", "unseen-restart"])
def test_a_restarted_daemon_serves_l3_after_the_client_reconnects(
    daemon: Daemon, engine_mod: ModuleType, call_while_down: bool
) -> None:
    """seen-down: the client meets UNAVAILABLE, backs off, reconnects and registers again. unseen-restart:
    its next call reaches the new daemon, which does not know the handle: it registers again and retries."""
    conn = _connector(daemon.address, engine_mod)
    tokens = engine_mod.prompt(3, TOKENS)
    assert conn.store(tokens, engine_mod.source_kv(3, TOKENS, False)).tokens_stored == FULL
    old_segment = conn.client.registration(conn.namespace).segment
    assert daemon.stop(signal.SIGTERM) == 0
    if call_while_down:
        down = conn.load(tokens, engine_mod.empty_kv(3, TOKENS, False))
        assert down.tokens_loaded == 0
    daemon.start()
    results = []

    def loaded() -> bool:
        kv = engine_mod.empty_kv(3, TOKENS, False)
        res = conn.load(tokens, kv)
        results.append((res, kv))
        return res.tokens_loaded > 0

    wait_until(loaded, WAIT_S, "the client to reconnect and load")
    res, kv = results[-1]
    assert res.tokens_loaded == FULL
    assert engine_mod.exact(kv, 3, TOKENS, FULL)
    assert conn.client.registration(conn.namespace).segment != old_segment  # re-mapped the new segment
    conn.client.close()


def test_a_killed_engine_loses_its_lease_at_the_ttl(
    daemon: Daemon, run_engine: RunEngine, spawn_engine: Callable[..., Any], engine_mod: ModuleType
) -> None:
    common = {"address": daemon.address, "seed": 4, "tokens": TOKENS}
    assert run_engine(mode="store", **common)["stored"] == FULL
    proc, held = spawn_engine(mode="hold", **common)
    assert held["lease_id"] != 0 and held["chunks"] == FULL // 16
    assert held["active_leases"] == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    client = TierCacheClient.connect(daemon.address)
    wait_until(lambda: client.stats().active_leases == 0, WAIT_S, "the dead engine's lease to expire")
    stats = client.stats()
    assert stats.expired_leases >= 1
    # Every L2 slot is reclaimable: one store that needs all of them succeeds.
    conn = KVConnector(client, engine_mod.namespace(), ConnectorConfig())
    reg = client.registration(engine_mod.namespace())
    assert reg.segment is not None
    n_tokens = reg.segment.num_slots * 16
    tokens = engine_mod.prompt(5, n_tokens)
    kv = ContiguousKV(engine_mod.token_major(5, n_tokens))
    assert conn.store(tokens, kv).tokens_stored == n_tokens
    client.close()


def test_daemon_down_means_zero_tokens_not_an_exception(tmp_path: Path, engine_mod: ModuleType) -> None:
    conn = _connector(f"unix:{tmp_path / 'nobody.sock'}", engine_mod)
    tokens = engine_mod.prompt(6, TOKENS)
    for _ in range(3):  # the first attempt fails at the socket, later ones at the backoff
        res = conn.load(tokens, engine_mod.empty_kv(6, TOKENS, False))
        assert (res.tokens_looked_up, res.tokens_hit, res.tokens_loaded) == (FULL, 0, 0)
        assert conn.store(tokens, engine_mod.source_kv(6, TOKENS, False)).tokens_stored == 0
        assert conn.lookup(tokens) == 0
    with pytest.raises(UnavailableError):
        conn.client.stats()
    remote = _connector(f"unix:{tmp_path / 'nobody.sock'}", engine_mod, data_plane=DataPlaneMode.STREAM)
    assert remote.load(tokens, engine_mod.empty_kv(6, TOKENS, True)).tokens_loaded == 0
    assert remote.store(tokens, engine_mod.source_kv(6, TOKENS, True)).tokens_stored == 0
    conn.client.close()
    remote.client.close()


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD], ids=["raw", "zstd"])
@pytest.mark.parametrize(
    ("store_remote", "load_remote"),
    [(True, True), (True, False), (False, True)],
    ids=["stream-stream", "stream-shm", "shm-stream"],
)
def test_byte_stream_round_trip(
    shared_daemon: Daemon, engine_mod: ModuleType, codec: Codec, store_remote: bool, load_remote: bool
) -> None:
    seed = 100 + 10 * int(store_remote) + 2 * int(load_remote) + (codec is Codec.ZSTD)
    tokens = engine_mod.prompt(seed, TOKENS)
    storer = _connector(shared_daemon.address, engine_mod, data_plane=_mode(store_remote), codec=codec)
    loader = _connector(shared_daemon.address, engine_mod, data_plane=_mode(load_remote), codec=codec)
    stored = storer.store(tokens, engine_mod.source_kv(seed, TOKENS, True))
    assert (stored.tokens_stored, stored.tokens_skipped, stored.remote) == (FULL, 0, store_remote)
    kv = engine_mod.empty_kv(seed, TOKENS, True)
    loaded = loader.load(tokens, kv)
    assert (loaded.tokens_hit, loaded.tokens_loaded, loaded.remote) == (FULL, FULL, load_remote)
    assert engine_mod.exact(kv, seed, TOKENS, FULL)
    storer.client.close()
    loader.client.close()


def test_stream_store_skips_the_cached_prefix(shared_daemon: Daemon, engine_mod: ModuleType) -> None:
    conn = _connector(shared_daemon.address, engine_mod, data_plane=DataPlaneMode.STREAM, codec=Codec.ZSTD)
    tokens = engine_mod.prompt(8, TOKENS)
    half = ContiguousKV(engine_mod.token_major(8, TOKENS))
    assert conn.store(tokens[:32], half).tokens_stored == 32
    res = conn.store(tokens, half)
    assert (res.tokens_stored, res.tokens_skipped, res.remote) == (32, 32, True)
    kv = engine_mod.empty_kv(8, TOKENS, False)
    assert conn.load(tokens, kv).tokens_loaded == FULL
    assert engine_mod.exact(kv, 8, TOKENS, FULL)
    conn.client.close()


def test_engine_copy_errors_release_the_lease_and_abort_the_store(
    daemon: Daemon, engine_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = _connector(daemon.address, engine_mod, load_ttl_s=60.0, store_ttl_s=60.0)
    tokens = engine_mod.prompt(9, TOKENS)
    src = engine_mod.source_kv(9, TOKENS, False)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("engine-side copy failed")

    import tiercache.connector.shm_plane as engine_module

    with monkeypatch.context() as m:
        m.setattr(engine_module, "kv_to_run", broken)
        m.setattr(engine_module, "kv_to_slots_checked", broken)  # the copy of a contiguous CPU KV
        with pytest.raises(RuntimeError, match="engine-side copy"):
            conn.store(tokens, src)
    # Aborted, not left "being stored" until its 60 s TTL: a new store gets every chunk.
    assert conn.store(tokens, src).tokens_stored == FULL
    with monkeypatch.context() as m:
        m.setattr(engine_module, "run_to_kv", broken)
        with pytest.raises(RuntimeError, match="engine-side copy"):
            conn.load(tokens, engine_mod.empty_kv(9, TOKENS, False))
    assert conn.client.stats().active_leases == 0  # released, not waiting for its 60 s TTL
    conn.client.close()


def test_tenant_isolation(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens.toml"
    tokens_file.write_text('[tokens]\n"token-a" = "alice"\n"token-b" = "bob"\n')
    tokens_file.chmod(0o600)
    d = daemon_factory("--tokens-file", str(tokens_file))
    d.start()
    a = _connector(d.address, engine_mod, token="token-a")
    b = _connector(d.address, engine_mod, token="token-b")
    prompt = engine_mod.prompt(10, TOKENS)
    assert a.store(prompt, engine_mod.source_kv(10, TOKENS, False)).tokens_stored == FULL
    assert b.lookup(prompt) == 0
    assert b.load(prompt, engine_mod.empty_kv(10, TOKENS, False)).tokens_loaded == 0
    assert b.client.acquire_load(b.namespace, chunk_keys(b.namespace, prompt)).lease_id == 0
    kv = engine_mod.empty_kv(10, TOKENS, False)
    assert a.load(prompt, kv).tokens_loaded == FULL and engine_mod.exact(kv, 10, TOKENS, FULL)
    # B's handle differs from A's, and A's handle is refused to B (as if nobody had registered it).
    handle_a = a.client.registration(a.namespace).handle
    assert b.client.registration(b.namespace).handle != handle_a
    channel = open_channel(parse_address(d.address), ChannelConfig())
    try:
        stub = KVCacheServiceStub(channel)
        request = pb.LookupRequest(handle=handle_a, keys=chunk_keys(a.namespace, prompt))
        with pytest.raises(grpc.RpcError) as info:
            stub.Lookup(request, timeout=10, metadata=auth_metadata("token-b"))
        assert isinstance(error_from_rpc(info.value), NotFoundError)  # as an unknown handle: nothing leaks
    finally:
        channel.close()
    for bad in (None, "not-a-token"):
        stranger = _connector(d.address, engine_mod, token=bad)
        assert stranger.load(prompt, engine_mod.empty_kv(10, TOKENS, False)).tokens_loaded == 0
        with pytest.raises(PermissionDeniedError):
            stranger.client.register(stranger.namespace)
        stranger.client.close()
    for conn in (a, b):
        conn.client.close()


def test_control_calls_through_the_client(shared_daemon: Daemon, engine_mod: ModuleType) -> None:
    conn = _connector(shared_daemon.address, engine_mod, salt="control")
    client, ns = conn.client, conn.namespace
    reg = client.register(ns)
    assert reg.layout == ns.layout and reg.chunk_bytes == ns.layout.chunk_bytes == 4096
    assert reg.lease_ttl_s == 2.0 and reg.segment is not None and reg.segment.slot_bytes == 64 * 1024
    assert client.register(ns).handle == reg.handle  # deterministic
    tokens = engine_mod.prompt(11, TOKENS)
    keys = chunk_keys(ns, tokens)
    assert client.lookup(ns, keys).chunks == 0
    assert conn.store(tokens[:32], engine_mod.source_kv(11, TOKENS, False)).tokens_stored == 32
    info = client.lookup(ns, keys, prefetch=True)
    assert info.chunks == 2 and info.by_tier[TierLevel.L2] == 2
    assert client.prefetch(ns, keys, wait_s=5.0) == 2
    assert conn.lookup(tokens) == 32
    assert client.pin(ns, keys) == 2 and client.unpin(ns, keys[:1]) == 1  # chunks changed
    assert client.pin(ns) == 2 and client.unpin(ns) == 2  # the whole namespace: chunks it holds
    assert client.purge(ns) == 2
    assert client.lookup(ns, keys).chunks == 0 and conn.lookup(tokens) == 0
    stats = client.stats()
    assert stats.namespaces >= 1 and TierLevel.L2 in {t.level for t in stats.tiers}
    client.close()


def test_unawaited_calls_to_a_dead_daemon_neither_raise_nor_hang(
    daemon: Daemon, engine_mod: ModuleType
) -> None:
    conn = _connector(daemon.address, engine_mod)
    tokens = engine_mod.prompt(8, TOKENS)
    assert conn.store(tokens, engine_mod.source_kv(8, TOKENS, False)).tokens_stored == FULL
    client, ns = conn.client, conn.namespace
    lease = client.acquire_load(ns, chunk_keys(ns, tokens))
    assert lease.lease_id and daemon.stop(signal.SIGKILL) != 0
    client.release_load_nowait(ns, lease.lease_id)  # fails on a gRPC thread: logged, not raised
    client.report_usage(ns, {TierLevel.L2: 1}, 0, wait=False)
    with pytest.raises(UnavailableError):
        client.stats()  # the next waited call sees the dead daemon itself
    client.close()


def test_a_usage_report_sent_one_way_just_before_close_still_counts(
    daemon: Daemon, engine_mod: ModuleType
) -> None:
    """An engine that reports usage one-way and exits at once: close waits for the answer (closing the
    channel would cancel the call), so the daemon counts it; a SIGSTOPped daemon keeps the call in flight."""
    conn = _connector(daemon.address, engine_mod)
    client, ns = conn.client, conn.namespace
    assert conn.lookup(engine_mod.prompt(9, TOKENS)) == 0  # registered and connected
    before = {t.level: t.effective_hit_tokens for t in client.stats().tiers}[TierLevel.L2]
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        client.report_usage(ns, {TierLevel.L2: 3}, 0, wait=False)
        closing = threading.Thread(target=client.close)
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # waiting for the answer, not cancelling the call
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
    closing.join()
    with TierCacheClient.connect(daemon.address) as other:
        after = {t.level: t.effective_hit_tokens for t in other.stats().tiers}[TierLevel.L2]
    assert after - before == 3 * ns.layout.chunk_tokens


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD], ids=["raw", "zstd"])
def test_chunks_in_several_pieces_land_straight_in_contiguous_and_paged_kv(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType, codec: Codec
) -> None:
    # 4 KiB chunks in pieces of 1500 bytes: pieces straddle the chunk's per-layer K and V parts
    daemon = daemon_factory("--stream-chunk-bytes", "1500", "--max-message-bytes", "8192")
    daemon.start()
    conn = _connector(daemon.address, engine_mod, data_plane=DataPlaneMode.STREAM, codec=codec)
    tokens = engine_mod.prompt(21, TOKENS)
    assert conn.store(tokens, engine_mod.source_kv(21, TOKENS, False)).tokens_stored == FULL
    for paged in (False, True):  # written piece by piece / assembled, then scattered
        kv = engine_mod.empty_kv(21, TOKENS, paged)
        assert conn.load(tokens, kv).tokens_loaded == FULL
        assert engine_mod.exact(kv, 21, TOKENS, FULL)
    conn.client.close()

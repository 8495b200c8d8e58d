"""Conformance of the ``compare`` benchmark's chunk stores (files, Redis, tiercache over shared memory and
the byte stream), each against the real thing: a round trip is byte-exact, and ``clear`` removes what was
stored (the next round must store afresh, not find its chunks already there), ``close`` too."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiercache.bench.common.kvcheck import distinct_prompts, make_contiguous_kv, verify_kv, zeros_like_kv
from tiercache.bench.compare.peers import ChunkStore, FileStore, RedisStore, TierCacheStore
from tiercache.bench.compare.refmodel import ModelSpec, model_layout
from tiercache.connector import ClientConfig, TierCacheClient
from tiercache.keys import Namespace
from tiercache.testing.embedded import EmbeddedDaemonConfig, start_daemon
from tiercache.testing.redis import use_redis

LAYOUT = model_layout(ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128), 32)
TOKENS = 96
STORES = ["files", "redis", "tiercache", "tiercache-stream"]


def _redis_installed() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChunkStore]:
    """Each store kind on a fresh backend (a started redis-server or daemon, stopped afterwards)."""
    ns = Namespace("tiercache-bench/test-peers", request.param, LAYOUT)
    if request.param == "files":
        yield FileStore(ns, tmp_path / "files", fsync=False)
        return
    if request.param == "redis":
        if not _redis_installed():
            pytest.skip("needs redis-server and the redis client (CI installs them)")
        with use_redis(None, tmp_path) as (client, _desc):
            yield RedisStore(ns, client)
            assert client.dbsize() == 0, "close must leave the server empty"
        return
    daemon = EmbeddedDaemonConfig(slot_bytes=LAYOUT.chunk_bytes, l2_bytes=16 * LAYOUT.chunk_bytes)
    with start_daemon(daemon, tmp_path) as handle:
        client = TierCacheClient.connect(handle.address, handle.token, config=ClientConfig(timeout_s=60.0))
        try:
            yield TierCacheStore(ns, client, force_remote=request.param == "tiercache-stream")
        finally:
            client.close()


def test_clear_removes_what_was_stored_and_a_store_after_it_is_afresh(store: ChunkStore) -> None:
    chunks = TOKENS // LAYOUT.chunk_tokens
    tokens = distinct_prompts(1, TOKENS, seed=3)[0]
    kv = make_contiguous_kv(LAYOUT, TOKENS, seed=3)
    dst = zeros_like_kv(kv)
    assert store.load(tokens, dst) == 0
    assert store.store(tokens, kv) == chunks
    assert store.load(tokens, dst) == chunks and verify_kv(kv, dst, TOKENS) > 0
    store.clear()
    assert store.load(tokens, zeros_like_kv(kv)) == 0
    dst = zeros_like_kv(kv)
    assert store.store(tokens, kv) == chunks
    assert store.load(tokens, dst) == chunks and verify_kv(kv, dst, TOKENS) > 0
    store.close()

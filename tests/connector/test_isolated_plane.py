"""The connector on a daemon with tokens: each tenant's KVConnector uses the shared-memory plane over its
own anonymous pool (received by descriptor), loads are bit-exact, and one tenant's stores never reach
another's loads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tiercache.connector import ClientConfig, ConnectorConfig, KVConnector, Medium, TierCacheClient

Daemon = Any  # tests/connector/conftest.py:Daemon
TOKENS = 64


def _connector(address: str, token: str, engine: ModuleType) -> KVConnector:
    client = TierCacheClient.connect(address, token=token, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, engine.namespace("isolated"), ConnectorConfig())


def test_each_tenant_loads_its_own_bytes_through_its_own_pool(
    daemon_factory: Callable[..., Daemon], tmp_path: Path, engine_mod: ModuleType
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[tokens]\n"tok-a" = "team-a"\n"tok-b" = "team-b"\n')
    tokens.chmod(0o600)
    d = daemon_factory("--tokens-file", str(tokens))
    d.start()
    a = _connector(d.address, "tok-a", engine_mod)
    b = _connector(d.address, "tok-b", engine_mod)
    try:
        prompt = engine_mod.prompt(901, TOKENS)  # the same prompt and namespace for both tenants
        kv_a, kv_b = engine_mod.source_kv(901, TOKENS, True), engine_mod.source_kv(902, TOKENS, True)
        for conn in (a, b):
            assert conn.data_plane().kind is Medium.SHARED_MEMORY
        seg_a = a.client.registration(a.namespace).segment
        seg_b = b.client.registration(b.namespace).segment
        assert seg_a is not None and seg_b is not None
        assert seg_a.shm_segment.startswith("memfd:") and seg_a.shm_segment != seg_b.shm_segment
        assert a.store(prompt, kv_a).tokens_stored == TOKENS
        assert b.store(prompt, kv_b).tokens_stored == TOKENS  # stored twice: a tenant boundary is a wall
        for conn, seed in ((a, 901), (b, 902)):
            got = engine_mod.empty_kv(seed, TOKENS, True)
            loaded = conn.load(prompt, got)
            assert loaded.tokens_loaded == TOKENS and not loaded.remote
            assert engine_mod.exact(got, seed, TOKENS, TOKENS)  # each tenant gets its own bytes back
    finally:
        a.client.close()
        b.client.close()

"""Load policies and usage reports through the connector and a real daemon."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest

from tiercache.connector import (
    ClientConfig,
    ConnectorConfig,
    KVConnector,
    LoadPolicy,
    TierCacheClient,
    TierLevel,
)
from tiercache.errors import InvalidArgumentError
from tiercache.keys import chunk_keys
from tiercache.policies.load import PrefillModel

Daemon = Any  # tests/connector/conftest.py:Daemon
N = 64


def _connector(address: str, engine: ModuleType, salt: str, **cfg: Any) -> KVConnector:
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, engine.namespace(salt), ConnectorConfig(**cfg))


def _l2(conn: KVConnector) -> tuple[int, int, int]:
    stats = conn.client.stats()
    tier = stats.tier(TierLevel.L2)  # KeyError: the daemon has no L2
    return tier.effective_hit_tokens, tier.load_success_tokens, stats.recomputed_tokens


def _l2_settled(
    conn: KVConnector, before: tuple[int, int, int], want: tuple[int, int, int]
) -> tuple[int, ...]:
    """The change of :func:`_l2` since ``before`` once it equals ``want``, or after 10 s (usage reports are
    sent without waiting, so a Stats call can overtake the last one)."""
    deadline = time.monotonic() + 10.0
    while True:
        delta = tuple(a - b for a, b in zip(_l2(conn), before))
        if delta == want or time.monotonic() > deadline:
            return delta
        time.sleep(0.02)


def test_loads_say_where_tokens_came_from_and_report_usage(
    shared_daemon: Daemon, engine_mod: ModuleType
) -> None:
    seed = 601
    tokens = engine_mod.prompt(seed, N)
    conn = _connector(shared_daemon.address, engine_mod, "usage")
    assert conn.store(tokens, engine_mod.source_kv(seed, N, False)).tokens_stored == N
    before = _l2(conn)
    for policy in (None, LoadPolicy.best_effort(), LoadPolicy.timeout(1.0)):
        kv = engine_mod.empty_kv(seed, N, False)
        result = conn.load(tokens, kv, policy)
        assert (result.tokens_cached, result.tokens_loaded, dict(result.sources)) == (N, N, {TierLevel.L2: N})
        assert engine_mod.exact(kv, seed, N, N)
    assert _l2_settled(conn, before, (3 * N, 3 * N, 0)) == (3 * N, 3 * N, 0)


def test_cost_aware_with_a_fast_prefill_recomputes_and_reports_it(
    shared_daemon: Daemon, engine_mod: ModuleType
) -> None:
    seed = 602
    tokens = engine_mod.prompt(seed, N)
    fast = _connector(shared_daemon.address, engine_mod, "cost", prefill=PrefillModel(tokens_per_s=1e12))
    assert fast.store(tokens, engine_mod.source_kv(seed, N, False)).tokens_stored == N
    before = _l2(fast)
    result = fast.load(tokens, engine_mod.empty_kv(seed, N, False), LoadPolicy.cost_aware())
    assert (result.tokens_cached, result.tokens_loaded, result.tokens_recomputed) == (N, 0, N)
    assert _l2_settled(fast, before, (0, 0, N))[2] == N
    # A prefill model brought by the policy itself is declared for the namespace on the way.
    slow = LoadPolicy.cost_aware(PrefillModel(tokens_per_s=1.0))
    result = fast.load(tokens, engine_mod.empty_kv(seed, N, False), slow)
    assert result.tokens_loaded == N and 0 < result.estimated_load_s < result.estimated_recompute_s


def test_a_policy_the_daemon_cannot_serve_falls_back_to_recompute(
    shared_daemon: Daemon, engine_mod: ModuleType
) -> None:
    seed = 603
    tokens = engine_mod.prompt(seed, N)
    conn = _connector(shared_daemon.address, engine_mod, "no-model")
    assert conn.store(tokens, engine_mod.source_kv(seed, N, False)).tokens_stored == N
    for policy in (LoadPolicy.cost_aware(), LoadPolicy.timeout()):  # no models declared
        assert conn.load(tokens, engine_mod.empty_kv(seed, N, False), policy).tokens_loaded == 0
    with pytest.raises(InvalidArgumentError):
        LoadPolicy.timeout(-1.0)


def test_a_prefix_longer_than_shared_memory_loads_in_rounds_under_wait_complete(
    daemon_factory: Any, engine_mod: ModuleType
) -> None:
    """L2 holds 4 chunks, the prompt has 10 (all in L3): a load leases what fits, copies and releases it,
    then leases the rest; every byte arrives. Best effort takes only the prefix in L2 now, in one round."""
    # L2: 4 pages of 64 KiB, one chunk each; no L1, whose warm-up after a load would hold L2 copies a while
    d = daemon_factory("--l2-bytes", "256K", "--l1-device", "none")
    d.start()
    seed, chunk = 604, engine_mod.LAYOUT.chunk_tokens
    n = 10 * chunk
    tokens = engine_mod.prompt(seed, n)
    conn = _connector(d.address, engine_mod, "rounds")
    src = engine_mod.source_kv(seed, n, False)
    for upto in (4 * chunk, 8 * chunk, n):  # a shared-memory store must fit in L2 at once
        conn.store(tokens[:upto], src)
        deadline = time.monotonic() + 10.0  # L2 makes room once its chunks are written through to L3
        while conn.client.stats().pending_writes and time.monotonic() < deadline:
            time.sleep(0.02)
    assert conn.client.lookup(conn.namespace, chunk_keys(conn.namespace, tokens)).chunks == 10
    kv = engine_mod.empty_kv(seed, n, False)
    result = conn.load(tokens, kv)
    assert (result.tokens_cached, result.tokens_hit, result.tokens_loaded) == (n, n, n)
    assert sum(result.sources.values()) == n and result.tokens_recomputed == 0
    assert engine_mod.exact(kv, seed, n, n)
    best = conn.load(tokens, engine_mod.empty_kv(seed, n, False), LoadPolicy.best_effort())
    assert (best.tokens_cached, best.tokens_loaded) == (n, 0)  # no rounds: L2 holds the chain's end now

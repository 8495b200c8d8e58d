"""Round trips of a load phase, counted by the daemon's own per-method RPC metrics (``/metrics``).

A load through the shared-memory plane is one AcquireLoad: the lease release and the usage report of a load
ride on the namespace's next AcquireLoad or BeginStore (``Settlement``), and what no call carries is sent
on its own after ``settle_after_s`` — never waited on by the load itself.
"""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tiercache.connector import ClientConfig, ConnectorConfig, KVConnector, TierCacheClient, TierLevel
from tiercache.connector.channel import parse_address
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon
N = 4 * 16  # four full chunks of the test layout
WAIT_S = 20.0
_COUNT = re.compile(r'^tiercache_rpc_duration_seconds_count\{code="(\w+)",method="(\w+)"\} ([0-9.e+]+)$')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Metrics:
    """The daemon's ``/metrics``: finished RPCs per method."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def rpcs(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url, timeout=10.0) as reply:
            text = reply.read().decode()
        out: dict[str, int] = {}
        for line in text.splitlines():
            m = _COUNT.match(line)
            if m:
                out[m.group(2)] = out.get(m.group(2), 0) + int(float(m.group(3)))
        return out

    def since(self, before: dict[str, int]) -> dict[str, int]:
        now = self.rpcs()
        return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


def _setup(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType, settle_after_s: float
) -> tuple[KVConnector, _Metrics, list[int]]:
    port = _free_port()
    d = daemon_factory("--metrics-port", str(port), "--metrics-public")
    d.start()
    config = ClientConfig(timeout_s=10.0)
    client = TierCacheClient(parse_address(d.address), config=config, settle_after_s=settle_after_s)
    conn = KVConnector(client, engine_mod.namespace("round-trips"), ConnectorConfig())
    tokens = engine_mod.prompt(801, N)
    assert conn.store(tokens, engine_mod.source_kv(801, N, False)).tokens_stored == N
    return conn, _Metrics(port), tokens


def test_a_load_phase_is_one_round_trip(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType
) -> None:
    conn, metrics, tokens = _setup(daemon_factory, engine_mod, settle_after_s=60.0)
    before_stats = conn.client.stats()
    before = metrics.rpcs()
    for _ in range(3):
        kv = engine_mod.empty_kv(801, N, False)
        result = conn.load(tokens, kv)
        assert result.tokens_loaded == N and engine_mod.exact(kv, 801, N, N)
    # Three loads, three calls: each release and usage report rode on the next AcquireLoad.
    assert metrics.since(before) == {"AcquireLoad": 3}
    # Stats settles what is still queued (the last load's release and usage) first, and waits for it.
    after_stats = conn.client.stats()
    assert after_stats.active_leases == 0
    l2_before, l2_after = before_stats.tier(TierLevel.L2), after_stats.tier(TierLevel.L2)
    assert l2_after.effective_hit_tokens - l2_before.effective_hit_tokens == 3 * N
    assert metrics.since(before) == {"AcquireLoad": 3, "ReleaseLoad": 1, "ReportUsage": 1, "Stats": 1}
    conn.client.close()


def test_a_store_carries_the_release_and_an_idle_client_settles_alone(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType
) -> None:
    conn, metrics, tokens = _setup(daemon_factory, engine_mod, settle_after_s=0.2)
    conn.client.stats()  # nothing queued
    before = metrics.rpcs()
    assert conn.load(tokens, engine_mod.empty_kv(801, N, False)).tokens_loaded == N
    other = engine_mod.prompt(802, N)
    assert conn.store(other, engine_mod.source_kv(802, N, False)).tokens_stored == N
    assert metrics.since(before) == {"AcquireLoad": 1, "BeginStore": 1, "CommitStore": 1}
    # A load with no call after it: the background thread sends its release and usage within 0.2 s.
    before = metrics.rpcs()
    assert conn.load(other, engine_mod.empty_kv(802, N, False)).tokens_loaded == N
    wait_until(
        lambda: metrics.since(before).get("ReportUsage", 0) == 1,
        WAIT_S,
        "the idle client's settlement",
        poll_s=0.02,
    )
    wait_until(
        lambda: metrics.since(before).get("ReleaseLoad", 0) == 1,
        WAIT_S,
        "the idle client's release",
        poll_s=0.02,
    )
    assert conn.client.stats().active_leases == 0
    conn.client.close()


def test_close_settles_what_is_queued(daemon_factory: Callable[..., Daemon], engine_mod: ModuleType) -> None:
    conn, metrics, tokens = _setup(daemon_factory, engine_mod, settle_after_s=60.0)
    assert conn.load(tokens, engine_mod.empty_kv(801, N, False)).tokens_loaded == N
    before = metrics.rpcs()
    conn.client.close()
    assert metrics.since(before) == {"ReleaseLoad": 1, "ReportUsage": 1}


def test_a_call_of_another_namespace_sends_the_queued_settlement_at_once(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType
) -> None:
    conn, metrics, tokens = _setup(daemon_factory, engine_mod, settle_after_s=60.0)
    other = KVConnector(conn.client, engine_mod.namespace("round-trips-b"), ConnectorConfig())
    assert other.store(tokens, engine_mod.source_kv(801, N, False)).tokens_stored == N
    before = metrics.rpcs()
    assert conn.load(tokens, engine_mod.empty_kv(801, N, False)).tokens_loaded == N
    # B's AcquireLoad cannot carry A's release (the daemon settles the caller's handle only): it goes
    # one-way at once instead of waiting 60 s for A's next call.
    assert other.load(tokens, engine_mod.empty_kv(801, N, False)).tokens_loaded == N
    want = {"AcquireLoad": 2, "ReleaseLoad": 1, "ReportUsage": 1}
    wait_until(
        lambda: metrics.since(before) == want, WAIT_S, "A's settlement, sent with B's load", poll_s=0.02
    )
    conn.client.close()


def test_a_layerwise_load_is_one_round_trip(
    daemon_factory: Callable[..., Daemon], engine_mod: ModuleType
) -> None:
    conn, metrics, tokens = _setup(daemon_factory, engine_mod, settle_after_s=60.0)
    before = metrics.rpcs()
    kv = engine_mod.empty_kv(801, N, False)
    with conn.load_layerwise(tokens, kv) as load:
        assert load.result().tokens_loaded == N
    assert engine_mod.exact(kv, 801, N, N)
    assert metrics.since(before) == {"AcquireLoad": 1}  # its release and usage wait for the next call
    assert conn.client.stats().active_leases == 0
    conn.client.close()

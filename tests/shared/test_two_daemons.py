"""Two real daemons standing in for two hosts (own sockets, L2 segments and L3 directories) on one real
Redis Cluster: an engine on host 1 stores, an engine on host 2 loads bit-exactly through the shared tier;
a restarted host 2 with an empty L3 still hits; a SIGKILLed cluster node turns the tier off (counted in
Stats and /metrics) while local hits carry on, and the tier comes back with the node; a single server works.

No test asserts wall-clock timings; waits are bounded loops on observable state.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from typing import Any

import torch

from tiercache.connector import ConnectorConfig, ContiguousKV, KVConnector, TierCacheClient, TierLevel
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.redis import RedisDeployment
from tiercache.testing.waits import wait_until
from tiercache.tiers.shared import store_key

LAYOUT = KVLayout(2, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=4)
"""4 KiB per chunk."""
NAMESPACE = Namespace(model_id="test/shared-tiny", revision="r1", layout=LAYOUT, tokenizer_id="tok")
TOKENS = 64
WAIT_S = 30.0

Hosts = Callable[[str, str], Any]


def prompt(seed: int) -> list[int]:
    return [seed * 100_000 + t for t in range(TOKENS)]


def source(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(LAYOUT.num_layers)]


def empty() -> list[torch.Tensor]:
    shape = (2, TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(LAYOUT.num_layers)]


def connector(host: Any) -> KVConnector:
    return KVConnector(TierCacheClient.connect(host.address), NAMESPACE, ConnectorConfig())


def stored_in_cluster(conn: KVConnector, chunks: int) -> Callable[[], bool]:
    def check() -> bool:
        stats = conn.client.stats()
        return stats.pending_writes == 0 and stats.tier(TierLevel.SHARED).chunks >= chunks

    return check


def load(conn: KVConnector, seed: int) -> tuple[Any, bool]:
    """Load prompt ``seed``; the result and whether the loaded prefix is bit-exact."""
    kv = empty()
    res = conn.load(prompt(seed), ContiguousKV(kv))
    want = source(seed)
    exact = all(torch.equal(g[:, : res.tokens_loaded], w[:, : res.tokens_loaded]) for g, w in zip(kv, want))
    return res, exact


def seed_on_node(cluster: RedisDeployment, handle: bytes, node: int) -> int:
    """A prompt seed whose first chunk the cluster keeps on ``node``."""
    for seed in range(100, 200):
        key = store_key("tc:", chunk_id(handle, chunk_keys(NAMESPACE, prompt(seed))[0]))
        if cluster.owner(key) == node:
            return seed
    raise AssertionError(f"no prompt seed puts its first chunk on node {node}")


def metric(text: str, name: str, tier: str) -> float:
    match = re.search(rf'^tiercache_{name}\{{[^}}]*tier="{tier}"[^}}]*\}} (\S+)$', text, re.M)
    assert match is not None, f"no {name} for {tier} in /metrics"
    return float(match.group(1))


def test_a_prompt_stored_on_one_host_loads_on_the_other_and_after_a_restart(
    cluster: RedisDeployment, hosts: Hosts
) -> None:
    h1, h2 = hosts("h1", cluster.url).start(), hosts("h2", cluster.url).start()
    c1, c2 = connector(h1), connector(h2)
    try:
        assert c1.store(prompt(1), ContiguousKV(source(1))).tokens_stored == TOKENS
        wait_until(stored_in_cluster(c1, TOKENS // 16), WAIT_S, "host 1's write-through into the cluster")
        res, exact = load(c2, 1)
        assert res.tokens_loaded == TOKENS and exact
        assert dict(res.sources) == {TierLevel.SHARED: TOKENS}  # the load report names the shared tier
    finally:
        c2.client.close()
    h2.stop()
    shutil.rmtree(h2.l3)  # a new host: empty L3, new L2
    h2.start()
    c2 = connector(h2)
    try:
        res, exact = load(c2, 1)
        assert res.tokens_loaded == TOKENS and exact and dict(res.sources) == {TierLevel.SHARED: TOKENS}
        stats = c2.client.stats().tier(TierLevel.SHARED)
        assert stats.hits == TOKENS // 16 and stats.errors == 0
    finally:
        c1.client.close()
        c2.client.close()


def test_a_killed_cluster_node_is_counted_local_hits_carry_on_and_the_tier_comes_back(
    cluster: RedisDeployment, hosts: Hosts
) -> None:
    h1, h2 = hosts("h1", cluster.url).start(), hosts("h2", cluster.url).start()
    c1, c2 = connector(h1), connector(h2)
    try:
        on_dead = seed_on_node(cluster, c1.client.registration(NAMESPACE).handle, 1)
        for seed in (1, on_dead):
            assert c1.store(prompt(seed), ContiguousKV(source(seed))).tokens_stored == TOKENS
        wait_until(stored_in_cluster(c1, 2 * TOKENS // 16), WAIT_S, "host 1's write-through into the cluster")
        res, exact = load(c2, 1)  # now in host 2's own L2 too
        assert res.tokens_loaded == TOKENS and exact
        cluster.kill(1)
        try:
            # This prompt is only in the cluster, its first chunk on the dead node: a miss, not an error.
            res, exact = load(c2, on_dead)
            assert res.tokens_loaded == 0 and res.tokens_looked_up == TOKENS
            # The local copy of prompt 1 is served as before.
            res, exact = load(c2, 1)
            assert res.tokens_loaded == TOKENS and exact and dict(res.sources) == {TierLevel.L2: TOKENS}
            errors = c2.client.stats().tier(TierLevel.SHARED).errors
            assert errors >= 1
            assert metric(h2.metrics(), "tier_errors_total", "SHARED") >= 1
        finally:
            cluster.restart(1)  # it comes back empty (no persistence): it rejoins with its slots
        assert c1.store(prompt(3), ContiguousKV(source(3))).tokens_stored == TOKENS
        wait_until(
            stored_in_cluster(c1, 3 * TOKENS // 16), WAIT_S, "host 1's write-through after the node came back"
        )

        def shared_hit() -> bool:
            res, exact = load(c2, 3)
            assert exact
            return res.tokens_loaded == TOKENS

        wait_until(shared_hit, WAIT_S, "host 2 to use the shared tier again")
    finally:
        c1.client.close()
        c2.client.close()


def test_two_hosts_share_through_a_single_server(single: RedisDeployment, hosts: Hosts) -> None:
    h1, h2 = hosts("h1", single.url).start(), hosts("h2", single.url).start()
    c1, c2 = connector(h1), connector(h2)
    try:
        assert c1.store(prompt(7), ContiguousKV(source(7))).tokens_stored == TOKENS
        wait_until(stored_in_cluster(c1, TOKENS // 16), WAIT_S, "host 1's write-through into the server")
        res, exact = load(c2, 7)
        assert res.tokens_loaded == TOKENS and exact and dict(res.sources) == {TierLevel.SHARED: TOKENS}
    finally:
        c1.client.close()
        c2.client.close()

"""The shared tier inside the cache core: two caches (two hosts' daemons, in one process) on one real
Redis Cluster. What one stores the other finds, loads bit-exactly and reports as a shared-tier load;
contiguity, write policies, chunks the cluster loses, corrupt values, tenants and a single server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
import torch

from tiercache.cache import CacheManager
from tiercache.codec import Codec
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.policies.load import PrefillModel
from tiercache.stats import ChunkEvent, EventKind
from tiercache.testing.redis import RedisDeployment
from tiercache.tiers.base import TierLevel
from tiercache.tiers.shared import store_key
from tiercache.tiers.shared_client import SharedStore, record_keys
from tiercache.tiers.shared_config import SharedTierConfig
from tiercache.tiers.values import HEADER_BYTES

Payload = Callable[[int, int], torch.Tensor]


def store_prompt(
    cache: CacheManager, ns: Namespace, tokens: list[int], random_kv: Payload
) -> list[torch.Tensor]:
    ns_id = cache.register_namespace(ns)
    keys = chunk_keys(ns, tokens)
    payloads = [random_kv(ns.layout.chunk_bytes, seed) for seed in range(len(keys))]
    assert cache.put(ns_id, keys, payloads) == len(keys)
    cache.flush(30)  # the write-through copies reach the cluster on the write-back worker
    return payloads


def header_key(prefix: str, cid: bytes) -> bytes:
    return record_keys(store_key(prefix, cid))[0]


def payload_key(prefix: str, cid: bytes) -> bytes:
    return record_keys(store_key(prefix, cid))[1]


def client(deployment: RedisDeployment) -> redis.Redis | redis.RedisCluster:
    if deployment.cluster:
        return redis.RedisCluster(host="127.0.0.1", port=deployment.nodes[0].port)
    return redis.Redis(host="127.0.0.1", port=deployment.nodes[0].port)


def test_a_chunk_stored_by_one_cache_is_a_shared_hit_of_another(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(4 * namespace.layout.chunk_tokens))
    payloads = store_prompt(host1, namespace, tokens, random_kv)
    assert host1.stats().tier(TierLevel.SHARED).chunks == 4

    events: list[ChunkEvent] = []
    host2.subscribe(events.append)
    ns_id = host2.register_namespace(namespace)
    keys = chunk_keys(namespace, tokens)
    found = host2.lookup(ns_id, keys, count=True)
    assert found.chunks == 4 and found.by_tier[TierLevel.SHARED] == 4 and found.by_tier[TierLevel.L2] == 0
    found_there = (EventKind.STORED, TierLevel.SHARED, None)  # another daemon stored it: no local source
    assert [(e.kind, e.level, e.source) for e in events] == [found_there] * 4

    ticket = host2.acquire(ns_id, keys)
    try:
        assert [c.source for c in ticket.chunks] == [TierLevel.SHARED] * 4
        for chunk, payload in zip(ticket.chunks, payloads, strict=True):
            assert torch.equal(chunk.view, payload)
    finally:
        host2.release(ticket.lease_id)
    host2.report_usage(ns_id, {}, 0, {TierLevel.SHARED: 4 * 16})  # what the engine copied
    arrived = [(e.level, e.source) for e in events[4:] if e.kind is EventKind.STORED]
    assert arrived == [(TierLevel.L2, TierLevel.SHARED)] * 4  # the events say they came through SHARED
    stats = host2.stats()
    shared, l2 = stats.tier(TierLevel.SHARED), stats.tier(TierLevel.L2)
    assert shared.hits == 4 and l2.promotions == 4 and shared.lookup_hit_tokens == 4 * 16
    assert shared.load_success_tokens == 4 * 16 and shared.errors == 0
    assert host2.lookup(ns_id, keys).by_tier[TierLevel.L2] == 4  # promoted into L2 like an L3 hit
    # The load policies see its measured rate: one sample, the batch read of the 4 promoted chunks.
    assert host2.rates()[TierLevel.SHARED].samples == 1


def test_cost_aware_plans_price_a_shared_chunk_from_the_tiers_rate(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(2 * namespace.layout.chunk_tokens))
    store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host2.register_namespace(namespace)
    keys = chunk_keys(namespace, tokens)
    fast = host2.plan_load(ns_id, keys, PrefillModel(tokens_per_s=1.0))  # recompute is very slow: load all
    slow = host2.plan_load(ns_id, keys, PrefillModel(tokens_per_s=1e15))  # recompute is free: load nothing
    assert fast.chunks == 2 and slow.chunks == 0
    shared_s = host2.rates()[TierLevel.SHARED].seconds(nbytes)
    assert fast.load_s >= 2 * shared_s  # each chunk costs at least its read from the shared tier


def test_a_gap_in_the_cluster_ends_the_prefix(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
    key_prefix: str,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(4 * namespace.layout.chunk_tokens))
    store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host2.register_namespace(namespace)
    keys = chunk_keys(namespace, tokens)
    rc = client(cluster)
    try:
        # the cluster's LRU takes one key of the record: the record is gone
        assert rc.delete(payload_key(key_prefix, chunk_id(ns_id, keys[1]))) == 1
    finally:
        rc.close()
    assert host2.lookup(ns_id, keys).chunks == 1
    ticket = host2.acquire(ns_id, keys)
    assert len(ticket.chunks) == 1
    host2.release(ticket.lease_id)


def test_a_chunk_the_cluster_evicted_after_the_lookup_is_a_miss(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
    key_prefix: str,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(3 * namespace.layout.chunk_tokens))
    store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host2.register_namespace(namespace)
    keys = chunk_keys(namespace, tokens)
    assert host2.lookup(ns_id, keys).chunks == 3
    rc = client(cluster)
    try:
        rc.delete(header_key(key_prefix, chunk_id(ns_id, keys[2])))
    finally:
        rc.close()
    ticket = host2.acquire(ns_id, keys)
    assert len(ticket.chunks) == 2  # the vanished chunk is a miss, never a torn copy
    host2.release(ticket.lease_id)
    assert host2.lookup(ns_id, keys).chunks == 2  # and the index forgot it
    assert host2.stats().tier(TierLevel.SHARED).misses == 1


@pytest.mark.parametrize("damage", ["flipped-bit", "header-of-another", "short-payload", "payload-a-list"])
def test_a_corrupt_value_is_a_counted_miss_and_is_deleted(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
    key_prefix: str,
    damage: str,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(3 * namespace.layout.chunk_tokens))
    payloads = store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host2.register_namespace(namespace)
    keys = chunk_keys(namespace, tokens)
    ids = [chunk_id(ns_id, k) for k in keys]
    rc = client(cluster)
    try:
        if damage == "flipped-bit":  # one flipped payload bit: the checksum no longer matches
            value = bytearray(rc.get(payload_key(key_prefix, ids[1])))  # type: ignore[arg-type]
            value[-1] ^= 0xFF
            rc.set(payload_key(key_prefix, ids[1]), bytes(value))
        elif damage == "header-of-another":  # a header swapped in from another chunk: its checksum differs
            rc.set(header_key(key_prefix, ids[1]), rc.get(header_key(key_prefix, ids[2])))  # type: ignore[arg-type]
        elif damage == "short-payload":
            rc.set(payload_key(key_prefix, ids[1]), rc.get(payload_key(key_prefix, ids[1]))[:-1])  # type: ignore[index]
        else:  # a key of another type reads as absent: the record is gone, not served
            rc.delete(payload_key(key_prefix, ids[1]))
            rc.rpush(payload_key(key_prefix, ids[1]), b"x")
        got = host2.get(ns_id, keys)
        assert got[0] is not None and torch.equal(got[0], payloads[0])
        assert got[1] is None
        assert got[2] is not None and torch.equal(got[2], payloads[2])  # its neighbours are untouched
        corrupt = host2.stats().tier(TierLevel.SHARED).corrupt_reads
        assert corrupt == (0 if damage == "payload-a-list" else 1)
        if damage != "payload-a-list":
            assert rc.exists(header_key(key_prefix, ids[1]), payload_key(key_prefix, ids[1])) == 0
    finally:
        rc.close()


def test_a_record_is_two_keys_in_one_hash_slot(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
    key_prefix: str,
) -> None:
    host1 = make_cache(cluster.url, namespace.layout.chunk_bytes, name="h1")
    tokens = list(range(2 * namespace.layout.chunk_tokens))
    payloads = store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host1.register_namespace(namespace)
    ids = [chunk_id(ns_id, k) for k in chunk_keys(namespace, tokens)]
    rc = client(cluster)
    try:
        for cid, want in zip(ids, payloads, strict=True):
            assert cluster.owner(header_key(key_prefix, cid)) == cluster.owner(payload_key(key_prefix, cid))
            assert rc.get(payload_key(key_prefix, cid)) == want.numpy().tobytes()  # the payload as it is
            assert len(rc.get(header_key(key_prefix, cid))) == HEADER_BYTES  # type: ignore[arg-type]
    finally:
        rc.close()


def test_tenants_never_see_each_others_shared_chunks(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1")
    host2 = make_cache(cluster.url, nbytes, name="h2")
    tokens = list(range(2 * namespace.layout.chunk_tokens))
    ns_a = host1.register_namespace(namespace, tenant="alice")
    keys = chunk_keys(namespace, tokens)
    host1.put(ns_a, keys, [random_kv(nbytes, s) for s in range(2)])
    host1.flush(30)
    assert host2.lookup(host2.register_namespace(namespace, tenant="alice"), keys).chunks == 2
    ns_b = host2.register_namespace(namespace, tenant="bob")
    assert host2.lookup(ns_b, keys).chunks == 0
    assert host2.get(ns_b, keys) == [None, None]


def test_on_evict_writes_to_the_cluster_only_when_l3_evicts(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(cluster.url, nbytes, name="h1", write_policy=WritePolicyKind.ON_EVICT)
    host2 = make_cache(cluster.url, nbytes, name="h2")
    ns1, ns2 = host1.register_namespace(namespace), host2.register_namespace(namespace)
    first = chunk_keys(namespace, list(range(namespace.layout.chunk_tokens)))
    host1.put(ns1, first, [random_kv(nbytes, 0)])
    host1.flush(30)
    assert host2.lookup(ns2, first).chunks == 0  # on-evict: nothing written down yet
    assert host1.demote(ns1, first, TierLevel.SHARED) == 1  # an explicit demotion goes through the cluster
    assert host2.lookup(ns2, first).by_tier[TierLevel.SHARED] == 1


def test_the_tier_works_on_a_single_server(
    single: RedisDeployment, make_cache: Callable[..., CacheManager], namespace: Namespace, random_kv: Payload
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host1 = make_cache(single.url, nbytes, name="h1")
    host2 = make_cache(single.url, nbytes, name="h2", codec=Codec.ZSTD)
    tokens = list(range(2 * namespace.layout.chunk_tokens))
    payloads = store_prompt(host1, namespace, tokens, random_kv)
    ns_id = host2.register_namespace(namespace)
    got = host2.get(ns_id, chunk_keys(namespace, tokens))
    assert all(g is not None and torch.equal(g, p) for g, p in zip(got, payloads, strict=True))
    assert host2.tier(TierLevel.SHARED).store_kind == "server"  # type: ignore[attr-defined]
    assert host1.tier(TierLevel.SHARED).store_kind == "server"  # type: ignore[attr-defined]


@pytest.mark.parametrize("deployment", ["single", "cluster"])
def test_payloads_go_to_the_socket_as_they_are_even_with_hiredis(
    deployment: str, request: pytest.FixtureRequest
) -> None:
    """hiredis's command packer copies a memoryview argument twice; the tier's connections use redis-py's
    own packer, which sends a large argument as a separate piece: the payload object itself."""
    url = request.getfixturevalue(deployment).url
    store = SharedStore(SharedTierConfig(url=url))
    try:
        assert store.exists_many([b"tc:{00}"]) == [False]  # connects
        client: Any = store._connect()
        pool = (
            client.connection_pool
            if deployment == "single"
            else client.get_default_node().redis_connection.connection_pool
        )
        conn = pool.get_connection()
        try:
            payload = memoryview(bytearray(1 << 20))
            assert any(piece is payload for piece in conn.pack_command("SET", b"k", payload))
        finally:
            pool.release(conn)
    finally:
        store.close()


def test_the_victims_of_one_store_go_to_the_shared_tier_together_from_their_slots(
    cluster: RedisDeployment,
    make_cache: Callable[..., CacheManager],
    namespace: Namespace,
    random_kv: Payload,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nbytes = namespace.layout.chunk_bytes
    host = make_cache(cluster.url, nbytes, write_policy=WritePolicyKind.ON_EVICT)  # L2 of 16 slots
    first = list(range(16 * namespace.layout.chunk_tokens))
    payloads = store_prompt(host, namespace, first, random_kv)  # fills L2; on-evict: nothing below yet
    shared = host.tier(TierLevel.SHARED)
    batches: list[int] = []
    real_commit_from, real_commit = shared.commit_from, shared.commit

    def commit_from(slots: Any, srcs: Any, checksums: Any = None) -> None:
        batches.append(len(slots))
        real_commit_from(slots, srcs, checksums)

    def commit(slots: Any, checksums: Any = None) -> None:
        raise AssertionError("a demotion from a slot tier is written from the slot, not copied first")

    monkeypatch.setattr(shared, "commit_from", commit_from)
    monkeypatch.setattr(shared, "commit", commit)
    ns_id = host.register_namespace(namespace)
    later = chunk_keys(namespace, [10_000 + t for t in range(6 * namespace.layout.chunk_tokens)])
    assert host.put(ns_id, later, [random_kv(nbytes, 99)] * 6) == 6
    monkeypatch.setattr(shared, "commit", real_commit)

    assert batches == [6]  # the reservation's 6 victims, in one write
    keys = chunk_keys(namespace, first)
    ids = [chunk_id(ns_id, k) for k in keys]
    down = [i for i, there in enumerate(shared.contains(ids)) if there]
    assert len(down) == 6
    got = host.get(ns_id, [keys[i] for i in down])
    assert all(g is not None and torch.equal(g, payloads[i]) for g, i in zip(got, down, strict=True))

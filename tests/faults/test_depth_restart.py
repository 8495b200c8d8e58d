"""Chain depths survive a restart of the cache: L3 stores them with the values, the index restores them.

Real tiers through :func:`~tiercache.cache.build.build_cache` (L2 in shared memory, L3 in LMDB under
tmp_path): a chain stored with a start depth is written down to L3, the cache is closed and built again
on the same L3, and every chunk comes back with its depth; an L3 written without depths (an older
environment) still opens, with depth 0.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import lmdb
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.cache.build import CacheBuildConfig, build_cache
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.lmdb_env import META_DB

START_DEPTH = 5
CHUNKS = 6


def _build(tmp_path: Path, namespace: Namespace) -> CacheManager:
    nbytes = namespace.layout.chunk_bytes
    return build_cache(
        CacheBuildConfig(
            cache=CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH),
            l2=HostTierConfig(
                capacity_bytes=16 * nbytes,
                slot_bytes=nbytes,
                segment_prefix=f"tc-depth-{secrets.token_hex(3)}",
            ),
            l3=LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=4 << 20),
        )
    )


def _store_chain(cache: CacheManager, namespace: Namespace) -> tuple[bytes, list[bytes]]:
    ns_id = cache.register_namespace(namespace)
    tokens = list(range(CHUNKS * namespace.layout.chunk_tokens))
    keys = chunk_keys(namespace, tokens)
    payloads = [torch.full((namespace.layout.chunk_bytes,), i, dtype=torch.uint8) for i in range(CHUNKS)]
    assert cache.put(ns_id, keys, payloads, start_depth=START_DEPTH) == CHUNKS
    cache.flush(timeout_s=30)  # the write-downs into L3 have run
    return ns_id, keys


def _l3(cache: CacheManager) -> LmdbTier:
    tier = cache.tier(TierLevel.L3)
    assert isinstance(tier, LmdbTier)
    return tier


def test_depths_come_back_after_a_restart(tmp_path: Path, namespace: Namespace) -> None:
    cache = _build(tmp_path, namespace)
    try:
        ns_id, keys = _store_chain(cache, namespace)
        assert _l3(cache).contains([chunk_id(ns_id, k) for k in keys]) == [True] * CHUNKS
    finally:
        cache.close()

    again = _build(tmp_path, namespace)
    try:
        cids = [chunk_id(ns_id, k) for k in keys]
        stored = _l3(again).stored_depths()
        assert [stored.get(cid) for cid in cids] == [START_DEPTH + i for i in range(CHUNKS)]
        index = again._index  # what deepest-first eviction ranks by
        depths = [entry.depth for entry in (index.get(cid) for cid in cids) if entry is not None]
        assert depths == [START_DEPTH + i for i in range(CHUNKS)]
        assert again.register_namespace(namespace) == ns_id
        got = again.get(ns_id, keys)
        assert all(g is not None and int(g[0]) == i for i, g in enumerate(got))
    finally:
        again.close()


def test_an_l3_without_meta_records_opens_with_depth_zero(tmp_path: Path, namespace: Namespace) -> None:
    cache = _build(tmp_path, namespace)
    try:
        ns_id, keys = _store_chain(cache, namespace)
    finally:
        cache.close()
    env = lmdb.open(str(tmp_path / "l3"), max_dbs=3, subdir=True)  # as an environment of an older version
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(META_DB, txn=txn), delete=True)
    finally:
        env.close()

    again = _build(tmp_path, namespace)
    try:
        cids = [chunk_id(ns_id, k) for k in keys]
        assert _l3(again).stored_depths() == {}
        entries = [again._index.get(cid) for cid in cids]
        assert [e.depth for e in entries if e is not None] == [0] * CHUNKS
        assert again.register_namespace(namespace) == ns_id
        got = again.get(ns_id, keys)
        assert all(g is not None and int(g[0]) == i for i, g in enumerate(got))
    finally:
        again.close()

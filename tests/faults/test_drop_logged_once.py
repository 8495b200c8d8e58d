"""A write-down that fails is reported once: one warning naming the chunk, the tier and the reason (real L2
and L3 tiers; L3's LMDB map is too small for the chunks, so every write-down finds it full)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.keys import Namespace, chunk_id, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig

LAYOUT = KVLayout(num_layers=8, num_kv_heads=4, head_dim=32, dtype=KVDtype.BFLOAT16, chunk_tokens=16)
"""64 KiB chunks."""


def test_a_failed_write_down_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    namespace = Namespace(model_id="test/drop-once", revision="r1", layout=LAYOUT, tokenizer_id="tok")
    nbytes = namespace.layout.chunk_bytes
    l2 = HostTier(HostTierConfig(capacity_bytes=8 * nbytes, slot_bytes=nbytes, segment_prefix="tc-drop-once"))
    map_bytes = 64 << 10
    assert nbytes >= map_bytes  # no chunk fits the map
    l3 = LmdbTier(
        LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=64 << 20, map_size_bytes=map_bytes)
    )
    cache = CacheManager([l2, l3], CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH))
    try:
        ns_id = cache.register_namespace(namespace)
        key = chunk_keys(namespace, list(range(namespace.layout.chunk_tokens)))[0]
        with caplog.at_level(logging.INFO, logger="tiercache"):
            assert cache.put(ns_id, [key], [torch.ones(nbytes, dtype=torch.uint8)]) == 1
            cache.flush(timeout_s=30)
        assert cache.stats().tier(TierLevel.L3).dropped_chunks == 1
        cid = chunk_id(ns_id, key).hex()
        about = [r for r in caplog.records if cid in r.getMessage() and r.levelno >= logging.INFO]
        assert len(about) == 1, [r.getMessage() for r in about]
        assert about[0].levelno == logging.WARNING and "L3" in about[0].getMessage()
    finally:
        cache.close()

"""``build_cache``: the configured tiers (and only those) under one manager; a failed build closes what it opened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiercache.cache import CacheBuildConfig, CacheConfig, build_cache
from tiercache.errors import InvalidArgumentError
from tiercache.policies import WritePolicyKind
from tiercache.shm import SHM_DIR
from tiercache.tiers.base import TierLevel
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

SLOT = 4096
PREFIX = "tiercache-test-build"


def segments() -> list[str]:
    return sorted(p for p in os.listdir(SHM_DIR) if p.startswith(PREFIX + "."))


def test_every_tier_present(tmp_path: Path) -> None:
    config = CacheBuildConfig(
        cache=CacheConfig(write_policy=WritePolicyKind.ON_EVICT),
        l1=HbmTierConfig(capacity_bytes=4 * SLOT, slot_bytes=SLOT, device="cpu"),
        l2=HostTierConfig(capacity_bytes=4 * SLOT, slot_bytes=SLOT, segment_prefix=PREFIX),
        l3=LmdbTierConfig(path=str(tmp_path / "new" / "l3"), capacity_bytes=8 * (SLOT + HEADER_BYTES)),
    )
    cache = build_cache(config)
    try:
        assert cache.levels == (TierLevel.L1, TierLevel.L2, TierLevel.L3)
        assert isinstance(cache.tier(TierLevel.L2), HostTier)
        assert (tmp_path / "new" / "l3").is_dir()  # the L3 directory is created
        assert len(segments()) == 1
    finally:
        cache.close()
    assert segments() == []


def test_absent_tiers_are_not_built(tmp_path: Path) -> None:
    cache = build_cache(
        CacheBuildConfig(l2=HostTierConfig(capacity_bytes=2 * SLOT, slot_bytes=SLOT, segment_prefix=PREFIX))
    )
    try:
        assert cache.levels == (TierLevel.L2,)
        with pytest.raises(InvalidArgumentError, match="level"):
            cache.tier(TierLevel.L1)
    finally:
        cache.close()
    with pytest.raises(InvalidArgumentError, match=r"^tiers:"):
        build_cache(CacheBuildConfig())


def test_a_failing_later_tier_closes_the_earlier_ones(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = CacheBuildConfig(
        l1=HbmTierConfig(capacity_bytes=2 * SLOT, slot_bytes=SLOT, device="cpu"),
        l2=HostTierConfig(capacity_bytes=2 * SLOT, slot_bytes=SLOT, segment_prefix=PREFIX),
        l3=LmdbTierConfig(path=str(blocker / "l3"), capacity_bytes=8 * (SLOT + HEADER_BYTES)),
    )
    with pytest.raises(OSError):
        build_cache(config)
    assert segments() == []  # the L2 segment built before the failure was closed and unlinked


def test_a_bad_tier_config_fails_before_anything_leaks() -> None:
    config = CacheBuildConfig(
        l1=HbmTierConfig(capacity_bytes=2 * SLOT, slot_bytes=SLOT, device="cpu"),
        l2=HostTierConfig(capacity_bytes=-1, slot_bytes=SLOT, segment_prefix=PREFIX),
    )
    with pytest.raises(InvalidArgumentError, match="capacity_bytes"):
        build_cache(config)
    assert segments() == []

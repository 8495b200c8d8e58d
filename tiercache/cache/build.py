"""The one place tiers and a cache manager are assembled from configuration.

Primitives:
    CacheBuildConfig: the manager's ``CacheConfig`` plus an optional config per tier.
    build_cache: build the configured tiers (fastest first) and a manager over them; closes what it opened
        when a later tier fails.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from tiercache.cache.config import CacheConfig
from tiercache.cache.manager import CacheManager
from tiercache.errors import InvalidArgumentError
from tiercache.tiers.base import StorageTier
from tiercache.tiers.hbm import HbmTier, HbmTierConfig
from tiercache.tiers.host import HostTier, HostTierConfig
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.shared import SharedTier, SharedTierConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CacheBuildConfig:
    """What to build: the manager's policies and the tiers that are present.

    Attributes:
        cache: policies and timing of the manager.
        l1: the L1 device pool, or None for none.
        l2: the L2 shared-memory slab, or None for none.
        l3: the L3 LMDB store (its directory is created), or None for none.
        shared: the shared tier (a Redis Cluster or server every daemon reads and writes), or None.
    """

    cache: CacheConfig = field(default_factory=CacheConfig)
    l1: HbmTierConfig | None = None
    l2: HostTierConfig | None = None
    l3: LmdbTierConfig | None = None
    shared: SharedTierConfig | None = None


def _open_l3(config: LmdbTierConfig) -> LmdbTier:
    os.makedirs(config.path, exist_ok=True)
    return LmdbTier(config)


def build_cache(config: CacheBuildConfig, clock: Callable[[], float] = time.monotonic) -> CacheManager:
    """Build the configured tiers and a cache manager that owns them (blocking: L2 pre-faults, L3 re-indexes).

    Args:
        config: what to build; at least one tier.
        clock: the manager's clock.

    Raises:
        InvalidArgumentError: no tier is configured, or a tier refused its configuration.
        OSError: the system refused a tier's memory or files.
        (Tiers built before the failure are closed again.)
    """
    l1, l2, l3 = config.l1, config.l2, config.l3
    steps: list[Callable[[], StorageTier]] = []
    if l1 is not None:
        steps.append(partial(HbmTier, l1))
    if l2 is not None:
        steps.append(partial(HostTier, l2))
    if l3 is not None:
        steps.append(partial(_open_l3, l3))
    if config.shared is not None:
        steps.append(partial(SharedTier, config.shared))
    if not steps:
        raise InvalidArgumentError("tiers", "at least one tier is needed")
    built: list[StorageTier] = []
    try:
        for step in steps:
            built.append(step())
        return CacheManager(built, config.cache, clock=clock)
    except BaseException:
        for tier in reversed(built):
            try:
                tier.close()
            except Exception:
                logger.exception("closing %s after a failed build failed", tier.level.name)
        raise

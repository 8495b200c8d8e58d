"""Fixtures of the shared-tier tests: a real three-master Redis Cluster and a real single Redis server on
loopback ports (started once per session, stopped after it), and caches built over them.

Every test files its keys under a key prefix of its own, so tests never see each other's chunks.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.policies import WritePolicyKind
from tiercache.testing.redis import RedisDeployment, RedisToolsMissing, redis_cluster, redis_single
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisDeployment]:
    """A three-master Redis Cluster (no replicas) on loopback ports."""
    try:
        with redis_cluster(tmp_path_factory.mktemp("shared-cluster")) as deployment:
            yield deployment
    except RedisToolsMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisDeployment]:
    """One plain (non-cluster) redis-server on a loopback port."""
    try:
        with redis_single(tmp_path_factory.mktemp("shared-single")) as deployment:
            yield deployment
    except RedisToolsMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def key_prefix() -> str:
    """A key prefix of this test's own."""
    return f"t-{uuid.uuid4().hex[:12]}:"


CacheFactory = Callable[..., CacheManager]


@pytest.fixture
def make_cache(tmp_path: Path, key_prefix: str) -> Iterator[CacheFactory]:
    """Build caches (L2 of 16 slots of ``slot_bytes``, optional L3, the shared tier on ``url``); closed after."""
    built: list[CacheManager] = []

    def make(
        url: str,
        slot_bytes: int,
        name: str = "a",
        l3: bool = False,
        write_policy: WritePolicyKind = WritePolicyKind.WRITE_THROUGH,
        **shared: object,
    ) -> CacheManager:
        config = CacheBuildConfig(
            cache=CacheConfig(write_policy=write_policy),
            l2=HostTierConfig(
                capacity_bytes=16 * slot_bytes, slot_bytes=slot_bytes, segment_prefix=f"tc-shtest-{name}"
            ),
            l3=LmdbTierConfig(path=str(tmp_path / name / "l3"), capacity_bytes=64 * slot_bytes)
            if l3
            else None,
            shared=SharedTierConfig(url=url, key_prefix=key_prefix, **shared),  # type: ignore[arg-type]
        )
        cache = build_cache(config)
        built.append(cache)
        return cache

    yield make
    for cache in built:
        cache.close()


def _daemons_module() -> Any:
    spec = importlib.util.spec_from_file_location("shared_daemons", Path(__file__).with_name("daemons.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


daemons = _daemons_module()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[[str, str], Any]]:
    """A factory of :class:`daemons.Host` (not started) in ``tmp_path``; every one is stopped after."""
    made: list[Any] = []

    def make(name: str, url: str) -> Any:
        host = daemons.Host(name, tmp_path / name, url)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()

"""Fixtures of the shared-tier tests: a real three-master Redis Cluster and a real single Redis server on
loopback ports (the harness plugin's, started once per session), caches built over them, and real daemon
processes standing in for hosts.

Every test files its keys under a key prefix of its own, so tests never see each other's chunks.
"""

from __future__ import annotations

import secrets
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.policies import WritePolicyKind
from tiercache.testing.daemon import DaemonProcess, free_port
from tiercache.testing.redis import RedisDeployment
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig


@pytest.fixture(scope="session")
def cluster(redis_cluster: RedisDeployment) -> RedisDeployment:
    """The session's three-master Redis Cluster (the harness plugin's ``redis_cluster``)."""
    return redis_cluster


@pytest.fixture(scope="session")
def single(redis_single: RedisDeployment) -> RedisDeployment:
    """The session's plain (non-cluster) redis-server (the harness plugin's ``redis_single``)."""
    return redis_single


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


class Host(DaemonProcess):
    """A real daemon standing in for one host of a fleet (own socket, L2 segment, L3 directory, /metrics
    port) on the shared store at ``shared_url``."""

    def __init__(self, root: Path, shared_url: str) -> None:
        self.l3 = root / "l3"
        self.metrics_port = free_port()
        args = ["--l2-bytes", "4M", "--slot-bytes", "64K", "--l3-path", str(self.l3), "--l3-bytes", "16M",
                "--l1-device", "none", "--metrics-port", str(self.metrics_port), "--metrics-public", "--shared-url", shared_url,
                "--shared-timeout-s", "0.5", "--log-level", "DEBUG"]  # fmt: skip
        super().__init__(root, args, prefix=f"tc-shd-{secrets.token_hex(4)}")

    def metrics(self) -> str:
        """The text of ``/metrics``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[[str, str], Host]]:
    """A factory of :class:`Host` (not started) in ``tmp_path``; every one is stopped and cleaned up after."""
    made: list[Host] = []

    def make(name: str, url: str) -> Host:
        host = Host(tmp_path / name, url)
        made.append(host)
        return host

    yield make
    for host in made:
        host.cleanup()

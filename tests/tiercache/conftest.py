"""Fixtures of the tier tests: a real three-master Redis Cluster for the shared tier's conformance cases."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tiercache.testing.redis import RedisToolsMissing, redis_cluster


@pytest.fixture(scope="session")
def shared_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The seed URL of a three-master Redis Cluster on loopback ports, stopped after the session."""
    try:
        with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
            yield cluster.url
    except RedisToolsMissing as exc:
        pytest.skip(str(exc))

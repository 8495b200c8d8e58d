"""Fixtures of the tier tests: a real three-master Redis Cluster for the shared tier's conformance cases."""

from __future__ import annotations

import pytest

from tiercache.testing.redis import RedisDeployment


@pytest.fixture(scope="session")
def shared_url(redis_cluster: RedisDeployment) -> str:
    """The seed URL of the session's three-master Redis Cluster (the harness plugin's ``redis_cluster``)."""
    return redis_cluster.url

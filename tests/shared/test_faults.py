"""Faults of the shared tier against a real cluster: a node that stops answering (SIGSTOP: a slow network)
or goes away turns the tier off with a counted error, every call answering as a miss instead of waiting;
the tier tries again after its backoff and comes back with the node."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tiercache.errors import CapacityError
from tiercache.testing.redis import RedisDeployment, redis_single
from tiercache.tiers.shared import SharedTier, SharedTierConfig, store_key

N = 48
SIZE = 4096


@pytest.fixture
def tier(cluster: RedisDeployment, key_prefix: str) -> Iterator[SharedTier]:
    t = SharedTier(
        SharedTierConfig(
            url=cluster.url, key_prefix=key_prefix, op_timeout_s=0.3, backoff_initial_s=5.0, backoff_max_s=5.0
        )
    )
    yield t
    t.close()


def ids() -> list[bytes]:
    return [i.to_bytes(4, "little") * 8 for i in range(N)]


def fill(tier: SharedTier) -> None:
    slots = tier.reserve(ids(), [SIZE] * N)
    for i, s in enumerate(slots):
        s.buffer.fill_(i % 251)
    tier.commit(slots)


def read_all(tier: SharedTier) -> list[bool]:
    return tier.read_into(ids(), [torch.zeros(SIZE, dtype=torch.uint8) for _ in range(N)])


def wait_back(tier: SharedTier) -> None:
    deadline = time.monotonic() + 30
    while not all(read_all(tier)):
        assert time.monotonic() < deadline, "the tier did not come back"
        time.sleep(0.05)


def test_a_node_that_stops_answering_turns_the_tier_off_until_it_answers(
    cluster: RedisDeployment, tier: SharedTier, key_prefix: str
) -> None:
    fill(tier)
    assert all(read_all(tier))
    on_stopped = [cluster.owner(store_key(key_prefix, cid)) == 2 for cid in ids()]
    assert any(on_stopped) and not all(on_stopped)
    proc = cluster.nodes[2].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        assert read_all(tier) == [False] * N  # the whole batch is a miss: nothing partial
        assert tier.usage().errors == 1 and not tier.available
        assert tier.contains(ids()) == [False] * N  # off: answered at once, no call to the store
        with pytest.raises(CapacityError):
            tier.reserve([b"x" * 32], [SIZE])
        assert tier.usage().errors == 1
    finally:
        proc.send_signal(signal.SIGCONT)
    wait_back(tier)
    assert tier.available


def test_a_password_in_the_url_is_used_and_a_wrong_one_is_a_counted_error(
    tmp_path: Path, key_prefix: str
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    with redis_single(tmp_path / "auth", password="s3cret") as server:
        port = server.nodes[0].port
        good = SharedTier(SharedTierConfig(url=f"redis://:s3cret@127.0.0.1:{port}", key_prefix=key_prefix))
        bad = SharedTier(SharedTierConfig(url=f"redis://:wrong@127.0.0.1:{port}", key_prefix=key_prefix))
        try:
            (slot,) = good.reserve([b"k" * 32], [SIZE])
            slot.buffer.fill_(9)
            good.commit([slot])
            dst = torch.zeros(SIZE, dtype=torch.uint8)
            assert good.read_into([b"k" * 32], [dst]) == [True] and int(dst.sum()) == 9 * SIZE
            assert good.store_kind == "server" and good.usage().errors == 0
            assert bad.read_into([b"k" * 32], [dst]) == [False]
            assert bad.usage().errors == 1 and not bad.available
        finally:
            good.close()
            bad.close()

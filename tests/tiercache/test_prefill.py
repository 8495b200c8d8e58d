"""Single-flight prefill through the cache manager: claims, incremental publication, waits, take-over."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace, chunk_keys
from tiercache.tiers.host import HostTier, HostTierConfig


@pytest.fixture
def cache(namespace: Namespace) -> Iterator[CacheManager]:
    n = namespace.layout.chunk_bytes
    tier = HostTier(HostTierConfig(capacity_bytes=64 * n, slot_bytes=n, segment_prefix="tiercache-test-pf"))
    manager = CacheManager([tier], CacheConfig(lease_ttl_s=30.0))
    yield manager
    manager.close()


def chain(namespace: Namespace, *parts: int) -> list[bytes]:
    """A key chain whose chunk i is made of tokens derived from parts[i] (equal parts -> shared chunks)."""
    c = namespace.layout.chunk_tokens
    tokens = [p * 100_000 + t for p in parts for t in range(c)]
    return chunk_keys(namespace, tokens)


def publish(cache: CacheManager, ns_id: bytes, keys: list[bytes], start: int, count: int) -> None:
    """The leader computed chunks [start, start+count): store and publish them."""
    ticket = cache.begin_store(ns_id, keys[start : start + count], start_depth=start)
    for slot in ticket.slots:
        slot.buffer.fill_(slot.index + start)
    cache.commit_store(ticket.ticket_id)


def run(fn: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    t.start()
    return t, out


def test_identical_requests_one_leads_the_other_waits(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 1, 2, 3)
    leader = cache.claim_prefill(ns, keys)
    assert (leader.cached, leader.wait, leader.lead) == (0, 0, 3) and leader.claim_id > 0
    follower = cache.claim_prefill(ns, keys)
    assert (follower.cached, follower.wait, follower.lead, follower.claim_id) == (0, 3, 0, 0)
    t, out = run(lambda: cache.wait_prefill(ns, keys, timeout_s=60))
    publish(cache, ns, keys, 0, 1)
    publish(cache, ns, keys, 1, 1)
    t.join(timeout=0.2)
    assert t.is_alive(), "the follower needs chunk 2 too"
    publish(cache, ns, keys, 2, 1)
    t.join(timeout=20)
    assert out == [3]
    stats = cache.stats().prefill
    assert stats.waits == 1 and stats.active_claims == 0 and stats.claimed_chunks == 0


def test_a_partial_share_waits_only_for_the_shared_part(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    a = chain(namespace, 1, 2, 3, 4)
    b = chain(namespace, 1, 2, 7, 8)
    assert a[:2] == b[:2] and a[2] != b[2]
    cache.claim_prefill(ns, a)
    claim_b = cache.claim_prefill(ns, b)
    assert (claim_b.wait, claim_b.lead) == (2, 2)
    t, out = run(lambda: cache.wait_prefill(ns, b, timeout_s=60, claim_id=claim_b.claim_id))
    publish(cache, ns, a, 0, 2)  # A is still computing a[2:], which B does not need
    t.join(timeout=20)
    assert out == [2], "the wait must end with the shared part, not at its 60 s deadline"


def test_abort_lets_a_follower_take_over(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 1, 2)
    leader = cache.claim_prefill(ns, keys)
    cache.claim_prefill(ns, keys)
    t, out = run(lambda: cache.wait_prefill(ns, keys, timeout_s=60))
    publish(cache, ns, keys, 0, 1)
    assert cache.release_prefill(leader.claim_id) == 1
    t.join(timeout=20)
    assert out == [1]
    again = cache.claim_prefill(ns, keys)
    assert (again.cached, again.wait, again.lead, again.takeovers) == (1, 0, 1, 1)
    assert cache.stats().prefill.takeovers == 1


def test_a_dead_leader_loses_its_claim_at_the_ttl(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 5, 6)
    cache.claim_prefill(ns, keys, ttl_s=0.3)  # this leader never publishes nor releases
    assert cache.claim_prefill(ns, keys).wait == 2
    start = time.monotonic()
    assert cache.wait_prefill(ns, keys, timeout_s=60) == 0
    assert time.monotonic() - start < 30, "woken by the lapse at 0.3 s, not by its own 60 s deadline"
    takeover = cache.claim_prefill(ns, keys)
    assert (takeover.lead, takeover.takeovers) == (2, 2)
    assert cache.stats().prefill.expired_claims == 1


def test_a_follower_gives_up_at_its_own_deadline(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 3, 4)
    cache.claim_prefill(ns, keys, ttl_s=60)
    cache.claim_prefill(ns, keys)
    start = time.monotonic()
    assert cache.wait_prefill(ns, keys, timeout_s=0.2) == 0
    assert time.monotonic() - start < 30, "returned at its 0.2 s deadline, not at the leader's 60 s TTL"


def test_nothing_to_wait_for_returns_at_once(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 9, 10)
    publish(cache, ns, keys, 0, 1)
    assert cache.wait_prefill(ns, keys, timeout_s=30) == 1
    claim = cache.claim_prefill(ns, keys)
    assert (claim.cached, claim.wait, claim.lead) == (1, 0, 1)
    with pytest.raises(InvalidArgumentError, match="timeout_s"):
        cache.wait_prefill(ns, keys, timeout_s=-1)


def test_incremental_publication_keeps_the_rest_invisible(cache: CacheManager, namespace: Namespace) -> None:
    ns = cache.register_namespace(namespace)
    keys = chain(namespace, 11, 12, 13)
    ticket = cache.begin_store(ns, keys)
    for slot in ticket.slots:
        slot.buffer.fill_(slot.index)
    assert cache.commit_store(ticket.ticket_id, indices=[0]) == 1
    assert cache.lookup(ns, keys).chunks == 1
    with pytest.raises(InvalidArgumentError, match="indices"):
        cache.commit_store(ticket.ticket_id, indices=[0])
    assert cache.abort_store(ticket.ticket_id)  # the request was cancelled: the rest never shows
    assert cache.lookup(ns, keys).chunks == 1
    got = cache.get(ns, keys[:1])[0]
    assert got is not None and torch.all(got == 0)

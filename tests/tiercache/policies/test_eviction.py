"""The eviction policies' own rules: shadow caches and the adaptive policy, without a cache around them."""

from __future__ import annotations

import hashlib

import pytest

from tiercache.errors import InvalidArgumentError
from tiercache.policies import (
    AdaptivePolicy,
    Candidate,
    EvictionPolicyKind,
    LruPolicy,
    SegmentedPolicy,
    make_eviction_policy,
)
from tiercache.policies.shadow import MAX_SHADOW_CHUNKS, ShadowCache, ShadowSample


def cid(n: int) -> bytes:
    """A chunk id whose bytes look like a hash (the sample reads its last byte)."""
    return hashlib.blake2b(n.to_bytes(8, "little"), digest_size=16).digest()


def lru_rank(t: int, d: int, r: int) -> tuple[int, ...]:
    return LruPolicy().priority(Candidate(t, d, r))


def seg_rank(t: int, d: int, r: int) -> tuple[int, ...]:
    return SegmentedPolicy().priority(Candidate(t, d, r))


def test_a_shadow_hits_what_it_holds_and_drops_by_its_rank() -> None:
    shadow = ShadowCache(lru_rank)
    shadow.resize(2)
    assert [shadow.access(cid(i), i, 0) for i in range(3)] == [False, False, False]
    assert cid(0) not in shadow and len(shadow) == 2  # the least recent made room for the third
    assert shadow.access(cid(1), 3, 0)
    assert not shadow.access(cid(0), 4, 0)
    assert cid(2) not in shadow  # 1 was read at 3: 2 was the least recent
    # a copy written down is filed, but is never a hit and does not refresh a held id
    shadow.access(cid(9), 5, 0, demand=False)
    assert cid(9) in shadow and cid(1) not in shadow


def test_a_segmented_shadow_keeps_what_it_has_on_a_cycle() -> None:
    seg, lru = ShadowCache(seg_rank), ShadowCache(lru_rank)
    seg.resize(2)
    lru.resize(2)
    hits = {"seg": 0, "lru": 0}
    for t in range(12):  # a cycle over three ids through two slots
        hits["seg"] += seg.access(cid(t % 3), t, 0)
        hits["lru"] += lru.access(cid(t % 3), t, 0)
    assert hits["lru"] == 0 and hits["seg"] == 3  # one id stays and hits on each later pass


def test_the_sample_bounds_the_shadows_however_many_chunks_pass() -> None:
    sample = ShadowSample([lru_rank, seg_rank])
    for i in range(3 * MAX_SHADOW_CHUNKS):
        sample.access(cid(i), i, 0, True)
    assert 0 < sample.held() <= MAX_SHADOW_CHUNKS + 1
    sample.sized(1000)  # a tier of 1000 chunks: the shadows hold the sampled fraction of it
    assert sample.held() <= 1000


def test_one_operation_counts_once() -> None:
    sample = ShadowSample([lru_rank, seg_rank])
    sample.sized(4)
    assert sample.access(cid(1), 7, 0, True) == [False, False]
    assert sample.access(cid(1), 7, 0, True) is None  # promoted and read in one load: no hit
    assert sample.access(cid(1), 8, 0, True) == [True, True]
    assert sample.access(cid(2), 9, 0, False) is None  # written down: never a hit


def test_adaptive_starts_scan_resistant_and_turns_to_recency_when_recency_would_hit() -> None:
    p = AdaptivePolicy()
    p.sized(2)
    unread = Candidate(10, 0, 0)
    assert p.segmented and p.priority(unread) == (0, True, -10, 0)
    # never-read chunks a slower tier holds go first: the others would be copied down on the way out
    assert p.priority(Candidate(5, 0, 0, below=True)) < p.priority(unread) < p.priority(Candidate(4, 0, 0))
    for t, n in enumerate((1, 2, 3)):  # 1 and 2 fill both shadows; 3 makes room
        p.observe(cid(n), Candidate(t, 0, 0), True)
    # The segmented shadow let the newest unread id (2) go, the recency one the oldest (1): a demand for 2
    # hits in recency order only.
    p.observe(cid(2), Candidate(5, 0, 0), True)
    assert p.score == -1 and not p.segmented
    assert p.priority(unread) == (1, 10, 0) == p.priority(Candidate(10, 0, 3))


def test_adaptive_turns_back_to_segmented_only_on_a_saturated_score() -> None:
    p = AdaptivePolicy()
    p.sized(2)
    for t, n in enumerate((1, 2, 3, 2)):  # as above: one recency-only hit
        p.observe(cid(n), Candidate(t, 0, 0), True)
    assert p.score == -1 and not p.segmented
    queued = (0, True, -10, -2, cid(9))  # a never-read chunk queued in segmented mode
    rerank = p.reranked()
    assert rerank is not None and rerank(queued) == (*p.priority(Candidate(10, 2, 0)), cid(9))
    read = (1, 4, 0, cid(8))
    assert rerank(read) is read and p.reranked() is None  # once per turn
    scores: list[tuple[int, bool]] = []
    p.sized(5)
    for t in range(10, 100):  # a cycle of 6 ids over 5 slots (2 kept by the segmented shadow): its hits only
        p.observe(cid(10 + t % 6), Candidate(t, 0, 0), True)
        scores.append((p.score, p.segmented))
    turned = scores.index((16, True))
    assert all(not seg for _, seg in scores[:turned]) and 0 in [score for score, _ in scores[:turned]]
    assert all(seg for _, seg in scores[turned:]) and p.reranked() is None  # no re-rank that way


def test_adaptive_stays_scan_resistant_on_a_cycle() -> None:
    p = AdaptivePolicy()
    p.sized(2)
    for t in range(30):
        p.observe(cid(t % 3), Candidate(t, 0, 0), True)
    assert p.segmented and p.score > 0


def test_adaptive_ranks_copies_a_faster_tier_holds_first() -> None:
    p = AdaptivePolicy()
    dup, unread, read = Candidate(50, 0, 4, above=True), Candidate(60, 0, 0), Candidate(1, 0, 9)
    assert sorted([read, unread, dup], key=p.priority) == [dup, unread, read]
    assert LruPolicy().priority(dup) == LruPolicy().priority(Candidate(50, 0, 4))  # only adaptive looks


def test_adaptive_is_made_by_name_once_per_tier() -> None:
    p = make_eviction_policy("adaptive")
    assert isinstance(p, AdaptivePolicy)
    a, b = p.for_tier(), p.for_tier()
    assert a is not b and isinstance(a, AdaptivePolicy)
    lru = make_eviction_policy(EvictionPolicyKind.LRU)
    assert lru.for_tier() is lru
    with pytest.raises(InvalidArgumentError, match="valid: lru, lfu, segmented, adaptive"):
        make_eviction_policy("arc")


@pytest.mark.parametrize("kind", list(EvictionPolicyKind))
@pytest.mark.parametrize("segmented", [True, False])
def test_queue_items_in_bulk_are_each_chunks_priority_and_id(
    kind: EvictionPolicyKind, segmented: bool
) -> None:
    p = make_eviction_policy(kind).for_tier()
    if isinstance(p, AdaptivePolicy) and not segmented:
        p.score = -1  # recency mode
    ticks, depths, cids = [5, 6, 7, 9, 12], [0, 3, 7, 0, 63], [cid(n) for n in range(5)]
    expected = [(*p.priority(Candidate(t, d, 0)), c) for t, d, c in zip(ticks, depths, cids)]
    assert p.queue_items(ticks, depths, cids) == expected
    assert p.queue_items(range(3, 3), [], []) == []
    with pytest.raises(ValueError, match="last_access has 2 items, depths 1, cids 2"):
        p.queue_items([1, 2], [0], cids[:2])


def test_lru_and_segmented_rank_by_their_documented_fields() -> None:
    # the adaptive policy's shadows rank with the same functions, without building a Candidate
    assert LruPolicy().priority(Candidate(5, 2, 7)) == (5, -2)
    assert SegmentedPolicy().priority(Candidate(5, 2, 0)) == (0, -5, -2)  # never read: newest first
    assert SegmentedPolicy().priority(Candidate(5, 2, 1)) == (1, 5, -2)
    assert SegmentedPolicy().priority(Candidate(9, 0, 0)) < SegmentedPolicy().priority(Candidate(1, 0, 1))


def test_a_candidate_cannot_be_changed() -> None:
    c = Candidate(1, 2, 3, above=True)
    assert (c.last_access, c.depth, c.hits, c.above, c.below) == (1, 2, 3, True, False)
    with pytest.raises(AttributeError):
        c.hits = 4  # type: ignore[misc]

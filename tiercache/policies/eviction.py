"""Eviction policies: a policy ranks the evictable chunks of one tier; the lowest priority goes first.

Chunks under a lease, pinned chunks and chunks younger than the minimum residency never reach the policy.

A policy with state of its own (the adaptive one) is made once per tier (:meth:`EvictionPolicy.for_tier`)
and told of the tier's accesses (:meth:`EvictionPolicy.observe`) and of its size when it must make room
(:meth:`EvictionPolicy.sized`); the others ignore both. When its ranking of chunks already queued changes,
it says how to re-rank them (:meth:`EvictionPolicy.reranked`, asked before each victim choice).

Primitives:
    Candidate: what a policy may look at.
    RankedChunk: a chunk's priority and id in one tuple (``EvictionPolicy.queue_items``, a warm start).
    EvictionPolicyKind, EvictionPolicy, LruPolicy, LfuPolicy, SegmentedPolicy, AdaptivePolicy,
    make_eviction_policy.
"""

from __future__ import annotations

import abc
import enum
import operator
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import NamedTuple

from tiercache.policies.registry import parse_kind
from tiercache.policies.shadow import ShadowSample


class Candidate(NamedTuple):
    """An evictable chunk as a policy sees it.

    A named tuple rather than a frozen dataclass: the cache builds several per chunk a lease touches (the
    re-ranking of each copy, each access told to the policies), and a frozen dataclass costs ~2.5x more to
    build (its ``__init__`` goes through ``object.__setattr__`` per field), which was ~10 % of leasing a
    chunk in the daemon.

    Attributes:
        last_access: logical time of the last store or read in this tier (one tick per cache operation, so
            chunks touched by one request share it).
        depth: position of the chunk in its hash chain (0 = first chunk of a prompt).
        hits: reads served for this chunk, any tier.
        above: a faster tier holds a copy too (this one is a duplicate while that copy lasts).
        below: a slower tier holds a copy too (this one can go without a copy down).
    """

    last_access: int
    depth: int
    hits: int
    above: bool = False
    below: bool = False


def _negated(values: Sequence[int]) -> Iterator[int]:
    """``-v`` of each value, one int object per distinct value (a million chunks have a few dozen depths)."""
    negated = {v: -v for v in set(values)}
    return map(negated.__getitem__, values)


def _same_length(last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]) -> None:
    if not len(last_access) == len(depths) == len(cids):
        raise ValueError(f"last_access has {len(last_access)} items, depths {len(depths)}, cids {len(cids)}")


RankedChunk = tuple[int | bytes, ...]
"""A chunk's priority followed by its id, one flat tuple (a victim queue's item)."""


class EvictionPolicyKind(enum.Enum):
    """Names of the eviction policies."""

    LRU = "lru"
    LFU = "lfu"
    SEGMENTED = "segmented"
    ADAPTIVE = "adaptive"


class EvictionPolicy(abc.ABC):
    """Ranks candidates; the smallest priority is evicted first."""

    access_ordered: bool = False
    """True when priority never decreases along access order, so a scan can stop early."""

    @abc.abstractmethod
    def priority(self, c: Candidate) -> tuple[int, ...]:
        """Sort key of a candidate: smaller goes first."""

    def queue_items(
        self, last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]
    ) -> list[RankedChunk]:
        """Many never-read chunks that this tier alone holds (a warm start files a million at once), ranked:
        ``(*priority(Candidate(t, d, 0)), cid)`` for each, in order (the victim queue's items).

        This default calls :meth:`priority` per chunk; the built-in policies build the tuples at C speed.
        """
        _same_length(last_access, depths, cids)
        return [(*self.priority(Candidate(t, d, 0)), c) for t, d, c in zip(last_access, depths, cids)]

    def for_tier(self) -> EvictionPolicy:
        """The instance one tier uses: the policy itself unless it keeps per-tier state."""
        return self

    def observe(self, cid: bytes, c: Candidate, demand: bool) -> None:
        """An access of ``cid`` in the tier, ignored by default.

        ``demand``: an engine asked for the chunk (a store after a miss, a read, a promotion out of or into
        the tier, a read served by a faster tier), whether or not the tier held it; False: a copy written
        down or demoted into the tier.
        """
        del cid, c, demand

    def sized(self, chunks: int) -> None:
        """The tier must make room while it and the faster tiers hold ``chunks`` evictable chunks (the cache
        down to this tier, whose chunks leave it through this tier's victims); ignored by default."""
        del chunks

    def reranked(self) -> Callable[[RankedChunk], RankedChunk] | None:
        """How to re-rank the tier's queued items when the ranking changed since the last call (each item to
        its new item, from the item alone), or None when it did not: a fixed ranking never does."""
        return None


def _lru_rank(last_access: int, depth: int, hits: int) -> tuple[int, ...]:
    """:class:`LruPolicy`'s priority from a candidate's fields (the adaptive policy's shadows rank with it
    on every sampled access without building a :class:`Candidate`)."""
    return (last_access, -depth)


def _segmented_rank(last_access: int, depth: int, hits: int) -> tuple[int, ...]:
    """:class:`SegmentedPolicy`'s priority from a candidate's fields (see :func:`_lru_rank`)."""
    if hits == 0:
        return (0, -last_access, -depth)
    return (1, last_access, -depth)


class LruPolicy(EvictionPolicy):
    """Least recently used first; among equals the deepest chunk of a chain, so shared ancestors survive."""

    access_ordered = True

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(last access, -depth)."""
        return _lru_rank(c.last_access, c.depth, c.hits)

    def queue_items(
        self, last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]
    ) -> list[RankedChunk]:
        """See :meth:`EvictionPolicy.queue_items`."""
        _same_length(last_access, depths, cids)
        return list(zip(last_access, _negated(depths), cids))


class LfuPolicy(EvictionPolicy):
    """Least frequently read first, then least recently used, then deepest."""

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(hits, last access, -depth)."""
        return (c.hits, c.last_access, -c.depth)

    def queue_items(
        self, last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]
    ) -> list[RankedChunk]:
        """See :meth:`EvictionPolicy.queue_items`."""
        _same_length(last_access, depths, cids)
        return list(zip(repeat(0), last_access, _negated(depths), cids))


class SegmentedPolicy(EvictionPolicy):
    """Scan-resistant: chunks never read since they were stored (a probation segment) go first, newest
    first; chunks read at least once (the protected segment) go after them, least recently used first.

    Under plain LRU a cycle over more prompts than the cache holds hits nothing: every chunk is evicted
    just before it comes back. Here a full cache keeps the chunks it already has and lets the newest
    unproven ones go, so a fixed part of the cycle stays and hits on every pass (close to the offline
    optimum), while anything read again (a system prompt, a chat history, a popular document) is protected
    and ranked by recency. Among equals the deepest chunk of a chain goes first, so shared ancestors
    survive.

    The price: never-read chunks that arrived early stay until they are read or pushed out by read ones,
    while the newest unread ones come and go; traffic whose reuse is recent (a chat's next turn after the
    cache filled with one-off prompts) loses. Hence it is a choice for cyclic or scan-heavy traffic, not
    the default.
    """

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(0, -last access, -depth) while never read; (1, last access, -depth) once read."""
        return _segmented_rank(c.last_access, c.depth, c.hits)

    def queue_items(
        self, last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]
    ) -> list[RankedChunk]:
        """See :meth:`EvictionPolicy.queue_items`."""
        _same_length(last_access, depths, cids)
        return list(zip(repeat(0), map(operator.neg, last_access), _negated(depths), cids))


_SCORE_LIMIT = 16
"""The adaptive policy's score saturates here: that many net shadow hits of the other order to switch back."""


class AdaptivePolicy(EvictionPolicy):
    """Recency or scan resistance, whichever would have hit more on this tier's recent traffic.

    Read chunks always rank by recency (least recently used first, deepest first among equals). A chunk
    never read since it arrived is ranked when it arrives (or changes) in the mode of the moment:

    * *segmented* mode (:class:`SegmentedPolicy`): before every read chunk, newest first, so that a full
      tier keeps what it has and a cycle over more prompts than it holds still hits on part of the cycle;
      those a slower tier holds too go before the others (the newest chunks are often still waiting for
      their write-down, and evicting one of those would copy it down on the store that made room);
    * *recency* mode (:class:`LruPolicy`): with the read ones by recency, so that a chunk reused soon after
      it arrived (a chat's next turn) survives one-off chunks that arrived earlier. The never-read chunks
      ranked in segmented mode before still go first: the one-offs a scan left behind are flushed.

    The mode comes from two shadow caches (:mod:`tiercache.policies.shadow`: ids only, no bytes, the size
    the cache sets with :meth:`sized`) that replay the tier's accesses (and the uses of its chunks that
    faster tiers serve: :meth:`EvictionPolicy.observe`) under each order on a hash sample of them; a net
    shadow hit moves a saturating score toward the order that had it. A tier starts scan-resistant (the
    first pass of a cycle leaves nothing to learn from) and turns to recency as soon as recency would have
    hit more (score < 0); it turns back only on a saturated score (+:data:`_SCORE_LIMIT`). The asymmetry:
    where scan resistance pays (a cycle) every chunk of the cycle is a segmented-only shadow hit and the
    score saturates within a few prompts; where the two orders are close (Zipf reuse with one-off
    chunks) the score wanders around 0, and flipping with it costs more than either order, because
    each stretch of segmented mode hoards the never-read chunks it ranks. (The ``workload`` bench's RAG
    trace at 16 MiB of L2, write-downs awaited after each request: L3 flipping at 0 hit 1580 chunks
    where plain LRU on the same slots hits 1600; with this rule, the re-ranking below and the
    hierarchy-wide recency and shadows of :mod:`tiercache.cache.space`, 1602.)

    When the mode turns to recency, the never-read chunks queued in segmented mode are re-ranked by
    recency (:meth:`reranked`: O(n) in the tier's queued chunks, once per turn; turns are rare, see
    above, and a tier of a million chunks re-ranks in about a second): left in segmented rank
    they would go before every other chunk, newest first, the reverse of recency, so that the chunks
    kept the longest would be the ones the tier filled up with. (Chunks queued in recency mode keep their
    rank when segmented mode returns: in front of them, the newest never-read chunks go first, which is
    what segmented mode wants.) Cost: O(log n) per sampled access and no scan (the shadows hold at most
    :data:`~tiercache.policies.shadow.MAX_SHADOW_CHUNKS` ids each).

    Before all of these go the copies a faster tier holds too, least recently used first: a tier whose
    faster neighbour keeps a subset of it (write-through) would otherwise spend its slots on duplicates,
    and the hierarchy would hold only as many distinct chunks as its largest tier. The faster copy, when
    evicted in turn, is demoted back as the write policy says (write-through and on-evict always).
    """

    def __init__(self) -> None:
        """A fresh tier's state: no score, empty shadows."""
        self._shadows = ShadowSample([_lru_rank, _segmented_rank])
        self.score = 0
        """Net shadow hits of the segmented order over the recency order, within +-_SCORE_LIMIT."""
        self._left_segmented = False  # the score fell below 0 since it last saturated at +_SCORE_LIMIT
        self._queued_segmented = True  # the mode the tier's queue was last ranked in (see reranked)

    @property
    def segmented(self) -> bool:
        """Whether never-read chunks are ranked in segmented mode now: score >= 0 until it first falls below
        0, then score >= +_SCORE_LIMIT until it saturates there (see the class docstring)."""
        return self.score >= (_SCORE_LIMIT if self._left_segmented else 0)

    def for_tier(self) -> AdaptivePolicy:
        """A fresh instance: each tier learns its own traffic."""
        return AdaptivePolicy()

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(-1, last access, -depth) for a copy a faster tier holds too; (0, not below, -last access,
        -depth) for a never-read chunk in segmented mode; else (1, last access, -depth)."""
        if c.above:
            return (-1, c.last_access, -c.depth)
        if c.hits == 0 and self.segmented:
            return (0, not c.below, -c.last_access, -c.depth)
        return (1, c.last_access, -c.depth)

    def queue_items(
        self, last_access: Sequence[int], depths: Sequence[int], cids: Sequence[bytes]
    ) -> list[RankedChunk]:
        """See :meth:`EvictionPolicy.queue_items` (neither above nor below: the tier alone holds them)."""
        _same_length(last_access, depths, cids)
        negative_depths = _negated(depths)
        if self.segmented:
            return list(zip(repeat(0), repeat(True), map(operator.neg, last_access), negative_depths, cids))
        return list(zip(repeat(1), last_access, negative_depths, cids))

    def observe(self, cid: bytes, c: Candidate, demand: bool) -> None:
        """Replay the access on the shadows; a demand that hits in one order only moves the score toward it."""
        hits = self._shadows.access(cid, c.last_access, c.depth, demand)
        if hits is None or hits[0] == hits[1]:
            return
        step = 1 if hits[1] else -1
        self.score = max(-_SCORE_LIMIT, min(_SCORE_LIMIT, self.score + step))
        if self.score < 0:
            self._left_segmented = True
        elif self.score == _SCORE_LIMIT:
            self._left_segmented = False

    def sized(self, chunks: int) -> None:
        """The shadows hold as many chunks (scaled by their sample) as the tier and the faster tiers."""
        self._shadows.sized(chunks)

    def reranked(self) -> Callable[[RankedChunk], RankedChunk] | None:
        """After a turn from segmented mode to recency: :func:`_by_recency` (see the class docstring)."""
        segmented = self.segmented
        turned = self._queued_segmented and not segmented
        self._queued_segmented = segmented
        return _by_recency if turned else None


def _by_recency(item: RankedChunk) -> RankedChunk:
    """A queued item of :class:`AdaptivePolicy` as recency mode ranks it: ``(0, not below, -last access,
    -depth, cid)`` (a never-read chunk ranked in segmented mode) becomes ``(1, last access, -depth, cid)``;
    any other item is ranked the same in both modes and stays."""
    if item[0] != 0:
        return item
    _, _, negative_last_access, negative_depth, cid = item
    assert isinstance(negative_last_access, int)
    return (1, -negative_last_access, negative_depth, cid)


_EVICTION: dict[EvictionPolicyKind, type[EvictionPolicy]] = {
    EvictionPolicyKind.LRU: LruPolicy,
    EvictionPolicyKind.LFU: LfuPolicy,
    EvictionPolicyKind.SEGMENTED: SegmentedPolicy,
    EvictionPolicyKind.ADAPTIVE: AdaptivePolicy,
}


def make_eviction_policy(kind: EvictionPolicyKind | str) -> EvictionPolicy:
    """Build an eviction policy by kind or by its name.

    Raises:
        InvalidArgumentError: unknown name (the message lists the valid ones).
    """
    return _EVICTION[parse_kind(EvictionPolicyKind, kind, "eviction_policy")]()

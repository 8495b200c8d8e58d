"""Eviction policies: a policy ranks the evictable chunks of one tier; the lowest priority goes first.

Chunks under a lease, pinned chunks and chunks younger than the minimum residency never reach the policy.

Primitives:
    Candidate: what a policy may look at.
    EvictionPolicyKind, EvictionPolicy, LruPolicy, LfuPolicy, SegmentedPolicy, make_eviction_policy.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from tiercache.policies.registry import parse_kind


@dataclass(frozen=True, slots=True)
class Candidate:
    """An evictable chunk as a policy sees it.

    Attributes:
        last_access: logical time of the last store or read in this tier (one tick per cache operation, so
            chunks touched by one request share it).
        depth: position of the chunk in its hash chain (0 = first chunk of a prompt).
        hits: reads served for this chunk, any tier.
    """

    last_access: int
    depth: int
    hits: int


class EvictionPolicyKind(enum.Enum):
    """Names of the eviction policies."""

    LRU = "lru"
    LFU = "lfu"
    SEGMENTED = "segmented"


class EvictionPolicy(abc.ABC):
    """Ranks candidates; the smallest priority is evicted first."""

    access_ordered: bool = False
    """True when priority never decreases along access order, so a scan can stop early."""

    @abc.abstractmethod
    def priority(self, c: Candidate) -> tuple[int, ...]:
        """Sort key of a candidate: smaller goes first."""


class LruPolicy(EvictionPolicy):
    """Least recently used first; among equals the deepest chunk of a chain, so shared ancestors survive."""

    access_ordered = True

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(last access, -depth)."""
        return (c.last_access, -c.depth)


class LfuPolicy(EvictionPolicy):
    """Least frequently read first, then least recently used, then deepest."""

    def priority(self, c: Candidate) -> tuple[int, ...]:
        """(hits, last access, -depth)."""
        return (c.hits, c.last_access, -c.depth)


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
        if c.hits == 0:
            return (0, -c.last_access, -c.depth)
        return (1, c.last_access, -c.depth)


_EVICTION: dict[EvictionPolicyKind, type[EvictionPolicy]] = {
    EvictionPolicyKind.LRU: LruPolicy,
    EvictionPolicyKind.LFU: LfuPolicy,
    EvictionPolicyKind.SEGMENTED: SegmentedPolicy,
}


def make_eviction_policy(kind: EvictionPolicyKind | str) -> EvictionPolicy:
    """Build an eviction policy by kind or by its name.

    Raises:
        InvalidArgumentError: unknown name (the message lists the valid ones).
    """
    return _EVICTION[parse_kind(EvictionPolicyKind, kind, "eviction_policy")]()

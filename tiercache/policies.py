"""Write and eviction policies: small objects behind one interface each, chosen through Enum-keyed registries.

Eviction: a policy ranks evictable chunks of one tier; the lowest priority goes first. Chunks under a lease,
pinned chunks and chunks younger than the minimum residency never reach the policy.

Write: a policy says when a chunk is written down to the tiers below the one it landed in: at commit
(write-through), when it is evicted (on-evict), or only once it proved worth keeping (selective).

Primitives:
    Candidate: what a policy may look at.
    EvictionPolicyKind, EvictionPolicy, LruPolicy, LfuPolicy, make_eviction_policy.
    WritePolicyKind, WritePolicy, WriteThrough, OnEvict, Selective, make_write_policy.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tiercache.errors import InvalidArgumentError


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


_EVICTION: dict[EvictionPolicyKind, type[EvictionPolicy]] = {
    EvictionPolicyKind.LRU: LruPolicy,
    EvictionPolicyKind.LFU: LfuPolicy,
}


def make_eviction_policy(kind: EvictionPolicyKind | str) -> EvictionPolicy:
    """Build an eviction policy by kind or by its name.

    Raises:
        InvalidArgumentError: unknown name (the message lists the valid ones).
    """
    return _EVICTION[_parse(EvictionPolicyKind, kind, "eviction_policy")]()


class WritePolicyKind(enum.Enum):
    """Names of the write policies."""

    WRITE_THROUGH = "write_through"
    ON_EVICT = "on_evict"
    SELECTIVE = "selective"


class WritePolicy(abc.ABC):
    """When a chunk goes down to the tiers below the one holding it."""

    @abc.abstractmethod
    def on_commit(self, pinned: bool) -> bool:
        """Write down (asynchronously) right after a store commits."""

    @abc.abstractmethod
    def on_hit(self, hits: int) -> bool:
        """Write down once a read brought the chunk's hit count to ``hits``."""

    @abc.abstractmethod
    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Demote to the next tier when evicted and held by no lower tier (False: drop it)."""


class WriteThrough(WritePolicy):
    """Every store is written down at once; an eviction that outruns the write-down demotes."""

    def on_commit(self, pinned: bool) -> bool:
        """Always."""
        return True

    def on_hit(self, hits: int) -> bool:
        """Already written at commit."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Always keep."""
        return True


class OnEvict(WritePolicy):
    """Chunks go down only when evicted from the tier above."""

    def on_commit(self, pinned: bool) -> bool:
        """Never at commit."""
        return False

    def on_hit(self, hits: int) -> bool:
        """Never on hits."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Always demote."""
        return True


class Selective(WritePolicy):
    """Only chunks read at least ``min_hits`` times, or pinned, are written down; the rest are dropped."""

    def __init__(self, min_hits: int) -> None:
        """Args: min_hits: reads after which a chunk is worth a lower tier (positive)."""
        if isinstance(min_hits, bool) or not isinstance(min_hits, int) or min_hits <= 0:
            raise InvalidArgumentError("selective_min_hits", f"must be a positive integer, got {min_hits!r}")
        self.min_hits = min_hits

    def on_commit(self, pinned: bool) -> bool:
        """Pinned chunks are written through."""
        return pinned

    def on_hit(self, hits: int) -> bool:
        """The read that reaches ``min_hits`` triggers the write-down."""
        return hits == self.min_hits

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Demote only proven chunks."""
        return pinned or hits >= self.min_hits


def make_write_policy(kind: WritePolicyKind | str, selective_min_hits: int = 2) -> WritePolicy:
    """Build a write policy by kind or by its name.

    Raises:
        InvalidArgumentError: unknown name (the message lists the valid ones) or bad ``selective_min_hits``.
    """
    return _WRITE[_parse(WritePolicyKind, kind, "write_policy")](selective_min_hits)


_WRITE: dict[WritePolicyKind, Callable[[int], WritePolicy]] = {
    WritePolicyKind.WRITE_THROUGH: lambda _: WriteThrough(),
    WritePolicyKind.ON_EVICT: lambda _: OnEvict(),
    WritePolicyKind.SELECTIVE: Selective,
}

_E = TypeVar("_E", bound=enum.Enum)


def _parse(enum_type: type[_E], value: object, field: str) -> _E:
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if member.value == value:
            return member
    valid = ", ".join(str(m.value) for m in enum_type)
    raise InvalidArgumentError(field, f"unknown value {value!r}; valid: {valid}")

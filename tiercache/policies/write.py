"""Write policies: when a chunk is written down to the tiers below the one it landed in.

At commit (write-through), when it is evicted (on-evict), or only when it is evicted after it proved worth
keeping (selective).

Primitives:
    WritePolicyKind, WritePolicy, WriteThrough, OnEvict, Selective, make_write_policy.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable

from tiercache.errors import InvalidArgumentError
from tiercache.policies.registry import parse_kind


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
    """Only chunks read at least ``min_hits`` times, or pinned, are written down; the rest are dropped.

    A proven chunk goes down when it is evicted, not at the read that proved it: while the tier above
    keeps it, a lower copy is never read, and writing it at once costs lower-tier bytes (SSD endurance)
    that nothing reads back (with L2 as large as L3 a write-down at the hit was written 54 MiB and read
    0 bytes on the ``workload`` RAG trace). Pinned chunks are written through at commit, so they are
    never lost to an eviction's failed demotion.
    """

    def __init__(self, min_hits: int) -> None:
        """Args: min_hits: reads after which a chunk is worth a lower tier (positive)."""
        if isinstance(min_hits, bool) or not isinstance(min_hits, int) or min_hits <= 0:
            raise InvalidArgumentError("selective_min_hits", f"must be a positive integer, got {min_hits!r}")
        self.min_hits = min_hits

    def on_commit(self, pinned: bool) -> bool:
        """Pinned chunks are written through."""
        return pinned

    def on_hit(self, hits: int) -> bool:
        """Never on hits: a proven chunk goes down when evicted."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Demote only proven chunks."""
        return pinned or hits >= self.min_hits


def make_write_policy(kind: WritePolicyKind | str, selective_min_hits: int = 2) -> WritePolicy:
    """Build a write policy by kind or by its name.

    Raises:
        InvalidArgumentError: unknown name (the message lists the valid ones) or bad ``selective_min_hits``.
    """
    return _WRITE[parse_kind(WritePolicyKind, kind, "write_policy")](selective_min_hits)


_WRITE: dict[WritePolicyKind, Callable[[int], WritePolicy]] = {
    WritePolicyKind.WRITE_THROUGH: lambda _: WriteThrough(),
    WritePolicyKind.ON_EVICT: lambda _: OnEvict(),
    WritePolicyKind.SELECTIVE: Selective,
}

"""Write policies: when a chunk is written down to the tiers below the one it landed in.

At commit (write-through), when it is evicted (on-evict), only when it is evicted after it proved worth
keeping (selective), or at commit once the tier it landed in is half full, and before that while the host
is idle or when evicted (watermark, the default).

Primitives:
    WritePolicyKind, WritePolicy, WriteThrough, OnEvict, Selective, Watermark, make_write_policy.
    WATERMARK_FILL: the share of a tier's capacity from which the watermark policy writes through.
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
    WATERMARK = "watermark"


WATERMARK_FILL = 0.5
"""The share of a tier's capacity in use from which :class:`Watermark` writes commits through."""


class WritePolicy(abc.ABC):
    """When a chunk goes down to the tiers below the one holding it."""

    @abc.abstractmethod
    def on_commit(self, pinned: bool, fill: float) -> bool:
        """Write down (asynchronously) right after a store commits; ``fill``: the share of the capacity of
        the tier the store landed in that is in use, the store included (0 to 1)."""

    @abc.abstractmethod
    def on_idle(self) -> bool:
        """Write down, once the host has a core to spare, a chunk that :meth:`on_commit` kept above."""

    @abc.abstractmethod
    def on_hit(self, hits: int) -> bool:
        """Write down once a read brought the chunk's hit count to ``hits``."""

    @abc.abstractmethod
    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Demote to the next tier when evicted and held by no lower tier (False: drop it)."""


class WriteThrough(WritePolicy):
    """Every store is written down at once; an eviction that outruns the write-down demotes."""

    def on_commit(self, pinned: bool, fill: float) -> bool:
        """Always."""
        return True

    def on_idle(self) -> bool:
        """Nothing is kept above at commit."""
        return False

    def on_hit(self, hits: int) -> bool:
        """Already written at commit."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Always keep."""
        return True


class OnEvict(WritePolicy):
    """Chunks go down only when evicted from the tier above."""

    def on_commit(self, pinned: bool, fill: float) -> bool:
        """Never at commit."""
        return False

    def on_idle(self) -> bool:
        """Only when evicted."""
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

    def on_commit(self, pinned: bool, fill: float) -> bool:
        """Pinned chunks are written through."""
        return pinned

    def on_idle(self) -> bool:
        """Only proven chunks, when evicted."""
        return False

    def on_hit(self, hits: int) -> bool:
        """Never on hits: a proven chunk goes down when evicted."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Demote only proven chunks."""
        return pinned or hits >= self.min_hits


class Watermark(WritePolicy):
    """Write-through once the tier a store lands in is :data:`WATERMARK_FILL` full; below that, a chunk goes
    down only when it is evicted (as on-evict), and pinned chunks are always written through.

    While a tier has room, nothing it holds is about to be evicted, and a write-down then only costs the host
    CPU and disk bandwidth the engines would use: with a working set that fits the engines' own caches, the
    write-down was most of what tiercache cost a serving engine on a small host (``tiercache-bench serve``,
    chat at concurrency 8 on 2 cores, 3 repeats: 0.86x plain vLLM's requests/s under write-through, 0.94x
    and 0.97x under this policy in the runs before and after it). Once the tier
    is half full, commits are written through as under write-through, so that evictions find their chunks
    already below; the chunks committed before that are demoted when evicted (on the eviction's path, once).
    A chunk stored under the mark is written down later, while the host has a core to spare
    (:meth:`on_idle`; :mod:`tiercache.cache.writeback`), and at a daemon's stop within its bound, so a warm
    restart finds it below. What it gives up: a daemon that dies before then loses such a chunk (a miss,
    never a wrong byte).
    """

    def __init__(self, fill: float = WATERMARK_FILL) -> None:
        """Args: fill: the share of the tier's capacity from which commits are written through (0 to 1)."""
        if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not 0.0 <= fill <= 1.0:
            raise InvalidArgumentError("watermark_fill", f"must be between 0 and 1, got {fill!r}")
        self.fill = float(fill)

    def on_commit(self, pinned: bool, fill: float) -> bool:
        """Pinned chunks, and every chunk once the tier is at the mark."""
        return pinned or fill >= self.fill

    def on_idle(self) -> bool:
        """Yes: a restart then finds what was stored under the mark, without costing a busy host anything."""
        return True

    def on_hit(self, hits: int) -> bool:
        """Never on hits: the upper copy serves them."""
        return False

    def on_evict(self, hits: int, pinned: bool) -> bool:
        """Always demote (a chunk committed under the mark is not below yet)."""
        return True


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
    WritePolicyKind.WATERMARK: lambda _: Watermark(),
}

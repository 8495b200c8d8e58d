"""Free runs of pages: the free space of one slot-tier partition, as maximal runs of consecutive pages.

A slot tier's memory is a row of fixed-size pages; a chunk takes one run of consecutive pages (as many as
its bytes need), so chunks of any mix of sizes waste less than one page each. The free pages are kept as
maximal runs: a run given back merges with the free runs on either side, so the space a deleted chunk
leaves is one run again as soon as its neighbours are free too.

A take is best fit: the shortest free run that holds the pages wanted (the lowest one among equals), so
long runs are kept for long chunks and a mix of sizes fragments the space as little as it can.

Costs: take and give are O(log r) searches plus one insertion into a sorted list of the r free runs (a
memmove in C), independent of the page count.

Not thread-safe: the slot tier calls it under its own lock.

Primitives:
    FreeRuns: take / give / take_any / total / largest over the free runs of ``[0, num_pages)``.
"""

from __future__ import annotations

import bisect


class FreeRuns:
    """Free pages of ``[0, num_pages)`` as maximal runs of consecutive pages."""

    def __init__(self, num_pages: int, free: bool) -> None:
        """Args: num_pages: pages in the space; free: whether they all start free (else all are taken)."""
        self.num_pages = num_pages
        self._by_start: dict[int, int] = {}  # start -> length
        self._by_end: dict[int, int] = {}  # end (exclusive) -> start
        self._sizes: list[tuple[int, int]] = []  # (length, start), sorted
        self._total = 0
        if free and num_pages > 0:
            self._add(0, num_pages)

    @property
    def total(self) -> int:
        """Free pages in all."""
        return self._total

    def largest(self) -> int:
        """Pages of the longest free run (0 when none is free)."""
        return self._sizes[-1][0] if self._sizes else 0

    def runs(self) -> list[tuple[int, int]]:
        """The free runs as ``(start, length)``, lowest first (for tests and diagnostics)."""
        return sorted(self._by_start.items())

    def take(self, count: int) -> int | None:
        """Take a run of ``count`` pages (best fit); its first page, or None when no free run is that long."""
        i = bisect.bisect_left(self._sizes, (count, -1))
        if i == len(self._sizes):
            return None
        length, start = self._sizes[i]
        self._remove(start, length)
        if length > count:
            self._add(start + count, length - count)
        return start

    def take_any(self, limit: int) -> tuple[int, int] | None:
        """Take up to ``limit`` free pages from the start of the longest run (pages to give back to the
        system); ``(start, count)``, or None when nothing is free."""
        if not self._sizes or limit <= 0:
            return None
        length, start = self._sizes[-1]
        count = min(length, limit)
        self._remove(start, length)
        if length > count:
            self._add(start + count, length - count)
        return start, count

    def give(self, start: int, count: int) -> None:
        """Pages ``[start, start + count)`` are free again; they merge with the free runs around them.

        Raises:
            ValueError: the pages are outside the space, or a free run starts or ends where they do (a run
                given twice: the cheap check; the tier keeps its own books of what is taken).
        """
        if (
            count <= 0
            or start < 0
            or start + count > self.num_pages
            or start in self._by_start
            or start + count in self._by_end
        ):
            raise ValueError(f"pages [{start}, {start + count}) are not a taken run of {self.num_pages}")
        before = self._by_end.get(start)
        if before is not None:
            self._remove(before, start - before)
            count += start - before
            start = before
        after = self._by_start.get(start + count)
        if after is not None:
            self._remove(start + count, after)
            count += after
        self._add(start, count)

    def _add(self, start: int, length: int) -> None:
        self._by_start[start] = length
        self._by_end[start + length] = start
        bisect.insort(self._sizes, (length, start))
        self._total += length

    def _remove(self, start: int, length: int) -> None:
        del self._by_start[start]
        del self._by_end[start + length]
        i = bisect.bisect_left(self._sizes, (length, start))
        del self._sizes[i]
        self._total -= length

"""Shadow caches: keys only, no bytes, replaying a tier's accesses under one ranking to learn which ranking
would have hit more.

A :class:`ShadowCache` holds at most ``capacity`` chunk ids; an access of an id it holds is a shadow hit,
any other access files the id (after making room by the ranking: smallest priority first). Its victims come
out of a min-heap with lazy invalidation, so an access costs O(log n) and never scans.

A :class:`ShadowSample` runs one shadow per ranking on a hash sample of a tier's chunk ids: every id while
the shadows are small, then a halving fraction (the ids whose last byte is below a bound) so that the
shadows never hold more than :data:`MAX_SHADOW_CHUNKS` ids however many chunks the tier indexes; each shadow's
capacity is the tier's capacity scaled by the same fraction.

Primitives:
    Priority, Rank, ShadowCache, ShadowSample, MAX_SHADOW_CHUNKS.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

Priority = tuple[int, ...]
Rank = Callable[[int, int, int], Priority]
"""A ranking: ``(last access, depth, reads) -> priority``, smallest goes first."""

MAX_SHADOW_CHUNKS = 4096
"""Ids one shadow may hold before the sample is halved (bounds the memory whatever the chunk count)."""

_COMPACT_SLACK = 64
_FULL_SAMPLE = 256
"""Sample bound meaning "every id": ids are sampled when their last byte is below the bound."""


class ShadowCache:
    """A key-only cache of ``capacity`` chunk ids ranked by ``rank`` (smallest goes first)."""

    def __init__(self, rank: Rank) -> None:
        """Args: rank: the ranking this shadow follows."""
        self._rank = rank
        self._state: dict[bytes, tuple[int, int]] = {}  # id -> (tick of its last access, reads)
        self._live: dict[bytes, tuple[Priority, bytes]] = {}
        self._heap: list[tuple[Priority, bytes]] = []
        self.capacity: int | None = None
        """Ids held at most (None: not known yet, nothing is dropped)."""

    def __len__(self) -> int:
        """Ids held."""
        return len(self._live)

    def __contains__(self, cid: object) -> bool:
        """Whether the shadow holds ``cid``."""
        return cid in self._live

    def access(self, cid: bytes, tick: int, depth: int, demand: bool = True) -> bool:
        """An access of ``cid`` at logical time ``tick``; True when the shadow held it (a shadow hit).

        A held id counts one more read; a new one is filed unread, after room is made for it. An access
        that is not a demand (a copy written down or demoted into the tier) files a new id but leaves a
        held one as it is.
        """
        state = self._state.get(cid)
        hit = state is not None
        if state is not None:
            if not demand:
                return True
            reads = state[1] + 1
        else:
            reads = 0
            if self.capacity is not None:
                self._trim(max(self.capacity - 1, 0))
                if self.capacity == 0:
                    return False
        self._state[cid] = (tick, reads)
        item = (self._rank(tick, depth, reads), cid)
        self._live[cid] = item
        heapq.heappush(self._heap, item)
        if len(self._heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)
        return hit

    def last_access(self, cid: bytes) -> int | None:
        """The tick of the last access of a held id (None: not held)."""
        state = self._state.get(cid)
        return None if state is None else state[0]

    def resize(self, capacity: int) -> None:
        """Hold at most ``capacity`` ids from now on (the smallest go at once when over)."""
        self.capacity = capacity
        self._trim(capacity)

    def drop_where(self, gone: Callable[[bytes], bool]) -> None:
        """Forget every id ``gone`` accepts (a smaller sample)."""
        for cid in [c for c in self._live if gone(c)]:
            del self._live[cid]
            del self._state[cid]
        self._heap = list(self._live.values())
        heapq.heapify(self._heap)

    def _trim(self, limit: int) -> None:
        while len(self._live) > limit and self._heap:
            item = heapq.heappop(self._heap)
            cid = item[1]
            if self._live.get(cid) is item:
                del self._live[cid]
                del self._state[cid]


class ShadowSample:
    """One shadow per ranking over a hash sample of a tier's ids; counts each shadow's hits."""

    def __init__(self, ranks: Sequence[Rank]) -> None:
        """Args: ranks: the rankings to compare."""
        self._shadows = [ShadowCache(rank) for rank in ranks]
        self._bound = _FULL_SAMPLE
        self._capacity: int | None = None

    def access(self, cid: bytes, tick: int, depth: int, demand: bool) -> list[bool] | None:
        """Replay one access on every shadow: which of them hit.

        None when the id is not in the sample, when the access is not a demand (``demand`` False: a copy
        written down or demoted into the tier, filed but never a hit), or when a shadow saw it already in
        the same cache operation (``tick``): a copy that arrives and is read at once (a promotion for a
        load) is one access, and its read must not count as a hit of the shadow that kept it a moment
        longer.
        """
        # Runs for every chunk a lease touches: plain loops, no generator or method call per shadow.
        if cid[-1] >= self._bound:
            return None
        shadows = self._shadows
        for shadow in shadows:
            state = shadow._state.get(cid)
            if state is not None and state[0] == tick:
                return None
        hits = [shadow.access(cid, tick, depth, demand) for shadow in shadows]
        held = 0
        for shadow in shadows:
            held = max(held, len(shadow._live))
        if self._bound > 1 and held > MAX_SHADOW_CHUNKS:
            self._bound //= 2
            bound = self._bound
            for shadow in self._shadows:
                shadow.drop_where(lambda c: c[-1] >= bound)
            self._resize()
        return hits if demand else None

    def held(self) -> int:
        """Ids the fullest shadow holds."""
        return max(len(s) for s in self._shadows)

    def sized(self, chunks: int) -> None:
        """The tier holds about ``chunks`` evictable chunks when it has to make room (its capacity)."""
        if chunks != self._capacity:
            self._capacity = chunks
            self._resize()

    def _resize(self) -> None:
        if self._capacity is not None:
            scaled = -(-self._capacity * self._bound // _FULL_SAMPLE)
            for shadow in self._shadows:
                shadow.resize(scaled)

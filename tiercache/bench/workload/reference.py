"""Reference caches for the ``workload`` benchmark: how close tiercache's eviction is to the best possible.

Both references replay the same trace at the same capacity (in chunks) as the measured run, with the
same rules of a prefix cache: a request hits the longest run of its leading chunks that are cached (a
chunk is only useful while every chunk before it is cached), and afterwards every chunk of the request
is offered to the cache. Hits are token-weighted; all full chunks carry the same number of tokens.

- **Belady's MIN** (offline, knows the future): on overflow the chunk whose next request lies farthest
  ahead goes first (never used again: first of all), a new chunk may be the one that goes (bypass), and
  ties go to the deeper chunk. Every request that holds a chunk also holds its predecessors, so a chunk's
  next use is never earlier than its predecessors' and the cached set stays prefix-closed: no cached
  chunk is ever stranded behind a gap. For equal-size items MIN maximises the number of hits, and a
  prefix-closed cache counts every cached requested chunk as a hit, so this is the optimum.
- **Plain LRU**: every chunk of a request is touched in prompt order, the least recently touched goes
  first. (It can evict a prompt's first chunk before its last: the reason prefix-aware policies exist.)

The capacity is every tier's slots together, as if no chunk were held twice. That is what the hardware
holds, so both references are fair bounds for any placement: a hierarchy that keeps a faster tier's chunks
in the slower one too (write-through) holds fewer distinct chunks, and that loss is the cache's to avoid
(the adaptive eviction policy lets such duplicates go first), not the reference's to forgive.

Primitives:
    ReferenceKind: MIN or LRU.
    reference_hit_chunks: replay chunk-key sequences on a reference cache, return the hit chunks.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import OrderedDict
from collections.abc import Container, Sequence


class ReferenceKind(enum.Enum):
    """The reference caches (values are their names in reports)."""

    MIN = "min"
    LRU = "lru"


def _check(capacity_chunks: int) -> None:
    if capacity_chunks < 0:
        raise ValueError(f"capacity_chunks must be >= 0, got {capacity_chunks}")


def _leading_hits(keys: Sequence[bytes], cached: Container[bytes]) -> int:
    hits = 0
    for key in keys:
        if key not in cached:
            break
        hits += 1
    return hits


def _lru(requests: Sequence[Sequence[bytes]], capacity: int) -> int:
    cache: OrderedDict[bytes, None] = OrderedDict()
    hits = 0
    for keys in requests:
        hits += _leading_hits(keys, cache)
        for key in keys:
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits


def _next_uses(requests: Sequence[Sequence[bytes]]) -> list[list[float]]:
    """``out[r][i]``: the index of the next request after ``r`` that holds ``requests[r][i]`` (inf: none)."""
    following: dict[bytes, float] = {}
    out: list[list[float]] = [[] for _ in requests]
    for r in range(len(requests) - 1, -1, -1):
        row = []
        for key in requests[r]:
            row.append(following.get(key, math.inf))
        for key in requests[r]:
            following[key] = r
        out[r] = row
    return out


def _min(requests: Sequence[Sequence[bytes]], capacity: int) -> int:
    nexts = _next_uses(requests)
    cached: dict[bytes, float] = {}  # key -> its next use (the heap entry that matches is current)
    heap: list[tuple[float, int, bytes]] = []  # (-next use, -depth, key): the top goes first
    hits = 0
    for r, keys in enumerate(requests):
        hits += _leading_hits(keys, cached)
        for depth, (key, nxt) in enumerate(zip(keys, nexts[r], strict=True)):
            cached[key] = nxt
            heapq.heappush(heap, (-nxt, -depth, key))
        while len(cached) > capacity:
            neg_next, _, key = heapq.heappop(heap)
            if cached.get(key) == -neg_next:
                del cached[key]
    return hits


def reference_hit_chunks(
    requests: Sequence[Sequence[bytes]], capacity_chunks: int, kind: ReferenceKind
) -> int:
    """Chunks hit when ``requests`` (each its chunk keys in prompt order) replay on a reference cache.

    Args:
        requests: per request, the keys of its full chunks (prefix keys: equal keys mean equal prefixes).
        capacity_chunks: how many chunks the reference cache holds.
        kind: which reference.

    Raises:
        ValueError: a negative capacity.
    """
    _check(capacity_chunks)
    if kind is ReferenceKind.MIN:
        return _min(requests, capacity_chunks)
    return _lru(requests, capacity_chunks)

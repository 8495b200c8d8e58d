"""Victim choice: which chunk of a tier goes next when the tier needs room.

Each tier has a :class:`VictimQueue`, a min-heap of its evictable chunks keyed by the eviction policy's
priority (ties broken by chunk id), with lazy invalidation: a chunk whose priority changes is pushed again
and its older heap items are skipped when they surface; a chunk that stops being evictable (leased, held by
a copy, pinned) is dropped from the queue and pushed back when it becomes evictable again. Choosing a victim
costs O(log n) plus the chunks skipped because they are only temporarily protected (younger than the minimum
residency, or in a pinned namespace), which are pushed back afterwards. The heap is rebuilt from its live
items when stale ones outnumber them, so its size stays O(live chunks).

The index (:mod:`tiercache.cache.index`) tells :class:`Space` about every change of a residency; nothing
here touches a tier. All methods run under the cache's index lock.

Each tier has its own instance of the policy (:meth:`~tiercache.policies.EvictionPolicy.for_tier`), told
of the tier's accesses (a read of its copy, the copy arriving, or a use of the chunk served by a faster
tier: :meth:`Space.accessed`) and, whenever the tier must make room, of the number of evictable chunks in
it and the faster tiers together, so that an adaptive policy learns per tier. A copy's recency is the
last use of its chunk in any tier.

Primitives:
    VictimQueue: push / push_many / discard / pop_min(eligible) / rerank over one tier's chunks.
    Space: the queues and policies of every tier: policy, refresh, accessed, backdate, forget, victim.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, cast

from tiercache.policies import Candidate, EvictionPolicy
from tiercache.policies.eviction import RankedChunk as QueueItem
from tiercache.tiers.base import TierLevel

if TYPE_CHECKING:
    from tiercache.cache.index import ChunkEntry

Priority = tuple[int, ...]

_ID = operator.itemgetter(-1)  # of a heap item

_COMPACT_SLACK = 64
"""Stale heap items tolerated beyond the live ones before the heap is rebuilt."""


def _ascending(items: list[QueueItem]) -> bool:
    """Whether each item is below the next (C-speed; stops at the first that is not)."""
    return all(map(operator.lt, items, itertools.islice(items, 1, None)))


class VictimQueue:
    """Evictable chunks of one tier, smallest (priority, chunk id) first.

    A heap item is the chunk's priority followed by its id, one flat tuple (:data:`QueueItem`); the live
    item of each chunk is kept by id, and a heap item that is not (by identity) its chunk's live item is
    stale. One object per queued chunk, no counter: a full index is millions of them. (Flat items order as
    ``(priority, chunk id)`` pairs would as long as no priority is a proper prefix of another of the same
    policy, true of every policy: their first element tells the kinds of different lengths apart.)
    """

    def __init__(self) -> None:
        """An empty queue."""
        self._heap: list[QueueItem] = []
        self._live: dict[bytes, QueueItem] = {}

    def __len__(self) -> int:
        """Chunks in the queue."""
        return len(self._live)

    def __contains__(self, cid: object) -> bool:
        """Whether a chunk is in the queue."""
        return cid in self._live

    def priority(self, cid: bytes) -> Priority | None:
        """The priority a chunk is queued with, or None when it is not queued."""
        item = self._live.get(cid)
        return None if item is None else cast("Priority", item[:-1])

    def push(self, cid: bytes, priority: Priority) -> None:
        """Queue a chunk with ``priority`` (replacing its previous priority)."""
        item: QueueItem = (*priority, cid)
        live = self._live
        if live.get(cid) == item:
            return
        live[cid] = item
        heap = self._heap
        heapq.heappush(heap, item)
        if len(heap) > 2 * len(live) + _COMPACT_SLACK:  # :meth:`_maybe_compact`, inlined: a push per access
            self._maybe_compact()

    def push_many(self, items: list[QueueItem]) -> None:
        """Queue many chunks at once (a warm start), given as items (each a priority followed by its chunk id,
        as ``EvictionPolicy.queue_items`` makes them; the queue keeps them): one heapify instead of a push
        each; a chunk given twice keeps its last item.

        Into an empty queue, items already in order (ascending, or descending: reversed) are a heap as they
        are: a warm start ranks in use order, which most policies' priorities follow one way or the other,
        and one comparison per item is cheaper than a heapify of tuples.
        """
        self._live.update(zip(map(_ID, items), items))
        if not self._heap and _ascending(items):
            self._heap = list(items)
        elif not self._heap and _ascending(items[::-1]):
            self._heap = items[::-1]
        else:
            self._heap.extend(items)
            heapq.heapify(self._heap)
        self._maybe_compact()

    def discard(self, cid: bytes) -> None:
        """Take a chunk out of the queue (absent chunks are ignored)."""
        if self._live.pop(cid, None) is not None:
            self._maybe_compact()

    def pop_min(self, eligible: Callable[[bytes], bool]) -> bytes | None:
        """Remove and return the smallest chunk that ``eligible`` accepts; None when there is none.

        Chunks ``eligible`` refuses stay queued.
        """
        skipped: list[QueueItem] = []
        found = None
        while self._heap:
            item = heapq.heappop(self._heap)
            cid = cast("bytes", item[-1])
            if self._live.get(cid) is not item:
                continue  # stale: the chunk was re-queued or discarded since
            if eligible(cid):
                del self._live[cid]
                found = cid
                break
            skipped.append(item)
        for item in skipped:
            heapq.heappush(self._heap, item)
        return found

    def rerank(self, new_item: Callable[[QueueItem], QueueItem]) -> None:
        """Replace every queued item by ``new_item(item)`` (the policy's ranking changed): O(n), one heapify."""
        self._live = {cid: new_item(item) for cid, item in self._live.items()}
        self._heap = list(self._live.values())
        heapq.heapify(self._heap)

    def ordered(self) -> list[bytes]:
        """Every queued chunk, smallest first (for tests and diagnostics; O(n log n))."""
        return [cast("bytes", item[-1]) for item in sorted(self._live.values())]

    def heap_size(self) -> int:
        """Items in the heap, stale ones included (bounded by twice the live ones plus a slack)."""
        return len(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)


class Space:
    """The victim queues of a cache's tiers, fed by the eviction policy."""

    def __init__(
        self,
        levels: Iterable[TierLevel],
        policy: EvictionPolicy,
        min_residency_s: float,
        protected: Callable[[TierLevel, ChunkEntry], bool] | None = None,
    ) -> None:
        """Args: levels: the cache's tiers; policy: ranks candidates; min_residency_s: protection of new
        chunks; protected: chunks a victim search must skip besides (tenants within their guaranteed share,
        :mod:`tiercache.cache.quotas`)."""
        self._queues = {level: VictimQueue() for level in levels}
        self._policies = {level: policy.for_tier() for level in self._queues}
        self._min_residency_s = min_residency_s
        self._protected = protected
        self.leaving: set[bytes] = set()
        """Chunks whose copy in some tier is being evicted with a demotion (:meth:`Mover.reserve`): their
        copies in slower tiers are not victims meanwhile (see :meth:`victim`)."""

    def queue(self, level: TierLevel) -> VictimQueue:
        """The victim queue of one tier."""
        return self._queues[level]

    def policy(self, level: TierLevel) -> EvictionPolicy:
        """The policy instance of one tier."""
        return self._policies[level]

    def refresh(self, cid: bytes, entry: ChunkEntry) -> None:
        """Re-rank every residency of a chunk after its access time, hits, holds or pin changed."""
        copies = entry.copies()
        fastest, slowest = copies[0].level if copies else None, copies[-1].level if copies else None
        for res in copies:
            level = res.level
            queue = self._queues[level]
            if res.holds > 0 or entry.pinned or entry.purged:
                queue.discard(cid)
            else:
                c = Candidate(res.last_access, entry.depth, entry.hits, level != fastest, level != slowest)
                queue.push(cid, self._policies[level].priority(c))

    def accessed(
        self, cid: bytes, entry: ChunkEntry, levels: Iterable[TierLevel], tick: int, demand: bool
    ) -> None:
        """Tell the policies of ``levels`` of an access of a chunk at ``tick`` (see ``EvictionPolicy.observe``:
        a store is a demand on every tier, a read or a promotion one on the tiers it involves, a copy
        written down or demoted none).

        A demand is a use of the chunk, whichever tier served it: every copy of it takes ``tick`` as its
        last access (the caller re-ranks them with :meth:`refresh`). Otherwise a copy in a slower tier
        would rank by the last read of that copy, while its reads are served by the faster copy: a chunk
        read from L2 on every request would look as old in L3 as when it was written down, and when L2 let
        it go, L3 (which holds it already, so nothing is demoted) would evict it long before chunks last
        used earlier. (The ``workload`` bench's RAG trace at 16 MiB of L2, L3 in recency mode: 1594 chunks
        hit with the stale order, 1600 with this one, plain LRU's 1600 on the same slots.) For the same
        reason the policies of the slower tiers are told of a demand too: their shadows replay every use
        of the chunks that may come down to them (:meth:`victim` sizes them for all of those)."""
        levels = list(levels)
        if demand:
            for res in entry.copies():
                if res.last_access < tick:
                    res.last_access = tick
            fastest = min(levels)
            levels = [level for level in self._policies if level >= fastest]
        c = Candidate(tick, entry.depth, entry.hits)
        for level in levels:
            self._policies[level].observe(cid, c, demand)

    def backdate(self, cid: bytes, entry: ChunkEntry, level: TierLevel, tick: int) -> None:
        """A copy made by a demotion outlived the copy it was made from: it takes that copy's last access
        ``tick`` when older than its own (the demotion was no use of the chunk) and is ranked again."""
        res = entry.find_copy(level)
        if res is not None and res.last_access > tick:
            res.last_access = tick
            self.refresh(cid, entry)

    def forget(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> None:
        """A residency ended (already taken out of ``entry``): the chunk's other copies are ranked again."""
        self._queues[level].discard(cid)
        if entry.tiers:
            self.refresh(cid, entry)

    def victim(
        self,
        level: TierLevel,
        now: float,
        entries: Mapping[bytes, ChunkEntry],
        pinned_namespaces: set[bytes],
        accept: Callable[[ChunkEntry], bool] | None = None,
    ) -> bytes | None:
        """Take the next victim of ``level`` out of its queue, or None when nothing is evictable.

        A chunk of a pinned namespace, or younger than the minimum residency, is skipped and stays queued,
        and so is the copy a demotion made of a chunk whose faster copy is being evicted (until the
        eviction drops that copy, the new one ranks as a duplicate, which go first: taken then, the chunk
        would leave both tiers); so is a protected one, unless ``accept`` is given: then only the chunks it
        accepts are candidates (a tenant trimming its own chunks).
        """

        def eligible(cid: bytes) -> bool:
            entry = entries[cid]
            if entry.namespace_id in pinned_namespaces:
                return False
            if accept is not None:
                if not accept(entry):
                    return False
            elif self._protected is not None and self._protected(level, entry):
                return False
            if cid in self.leaving and any(lv < level for lv in entry.levels):
                return False  # about to be the chunk's last copy, though it still ranks as a duplicate
            return now - entry.copy(level).stored_at >= self._min_residency_s

        queue, policy = self._queues[level], self._policies[level]
        # A chunk leaves the cache down to this tier through this tier's victims (a faster tier's victims
        # come down into it; its copies of the faster tiers' chunks go first): its policy ranks for all of
        # them, so it learns at their size.
        policy.sized(sum(len(q) for lv, q in self._queues.items() if lv <= level))
        rerank = policy.reranked()
        if rerank is not None:
            queue.rerank(rerank)
        return queue.pop_min(eligible)

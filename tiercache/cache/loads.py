"""Loads: leases on chunks of a slot tier (promoting them first), and copies out (``get``).

A leased chunk is held in its tier (never evicted, its slot never reused) until the lease is released or
lapses at its TTL. Bringing a chunk into the tier and copying a chunk out run through the mover with the
index lock released; reads of a tier that is not a slot tier (L3) are single-flight per chunk, so concurrent
``get`` calls of one chunk share one read.

Primitives:
    Loads: lease_one, view, drop_lease, read, hit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import torch

from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.leases import Lease
from tiercache.cache.mover import Mover
from tiercache.cache.writeback import WriteBack
from tiercache.policies import WritePolicy
from tiercache.singleflight import SingleFlight
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel


class Loads:
    """Leasing and reading over the index and the mover."""

    def __init__(
        self,
        lock: threading.RLock,
        tiers: Mapping[TierLevel, StorageTier],
        index: Index,
        mover: Mover,
        writes: WritePolicy,
        writeback: WriteBack,
    ) -> None:
        """Args: the cache's parts this one works with."""
        self._lock = lock
        self._tiers = tiers
        self._levels = sorted(tiers)
        self._index = index
        self._mover = mover
        self._writes = writes
        self._writeback = writeback
        self._reads: SingleFlight[torch.Tensor | None] = SingleFlight()

    @property
    def joins(self) -> int:
        """Reads that shared another caller's read."""
        return self._reads.joins

    def hit(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> None:
        """Count a read served by ``level`` and apply the write policy's on-hit rule (under the lock)."""
        if self._writes.on_hit(self._index.record_hit(cid, entry, level)):
            self._writeback.schedule(cid)

    def lease_one(
        self, cid: bytes, level: TierLevel, lease: Lease, bring: Callable[[], bool] | None
    ) -> TierLevel | None:
        """Add one chunk to a lease, bringing it into ``level`` first (``bring``) when needed.

        Returns:
            The tier the bytes came from (``level``, or the tier promoted from); None when not leased.
        """
        with self._lock:
            entry = self._index.visible(cid)
            if entry is None:
                self._index.counters[level].misses += 1
                return None
            if level in entry.res:
                self._take(cid, entry, level, lease)
                return level
            source = min(entry.res)
            self._index.counters[level].misses += 1
        if bring is None or not bring():
            return None
        with self._lock:
            entry = self._index.visible(cid)
            if entry is None or level not in entry.res:
                return None
            self._take(cid, entry, level, lease)
            return source

    def view(self, cid: bytes, level: TierLevel) -> tuple[int, torch.Tensor]:
        """Slot and zero-copy view of a leased chunk."""
        tier = self._tiers[level]
        assert isinstance(tier, SlotTier)
        with self._lock:
            slot, view = tier.slot_of(cid), tier.view(cid)
        assert slot is not None and view is not None
        return slot, view

    def drop_lease(self, lease: Lease) -> None:
        """End a lease's holds (call under the lock)."""
        for cid in lease.chunk_ids:
            self._mover.release_hold(cid, lease.level)

    def _take(self, cid: bytes, entry: ChunkEntry, level: TierLevel, lease: Lease) -> None:
        self._index.hold(cid, entry, level)
        lease.chunk_ids.append(cid)
        self._index.touch(cid, entry, level)
        self.hit(cid, entry, level)

    def read(self, cid: bytes, check_open: Callable[[], None]) -> torch.Tensor | None:
        """A CPU copy of a cached chunk from the fastest tier holding it, or None."""
        with self._lock:
            check_open()
            self._index.next_tick()
            entry = self._index.visible(cid)
            src = min(entry.res) if entry is not None else None
            for level in self._levels:
                if src is not None and level >= src:
                    break
                self._index.counters[level].misses += 1
            if entry is None or src is None:
                return None
            nbytes = entry.nbytes
        slot_tier = isinstance(self._tiers[src], SlotTier)

        def read() -> torch.Tensor | None:
            buf = torch.empty(nbytes, dtype=torch.uint8)
            if not self._mover.copy_out(cid, src, buf, observe=not slot_tier):
                return None
            with self._lock:
                current = self._index.get(cid)
                if current is not None and src in current.res:
                    self._index.touch(cid, current, src)
            return buf

        if slot_tier:
            result, joined = read(), False
        else:
            result, joined = self._reads.run((cid, src), read)
        if result is None:
            return None
        with self._lock:
            current = self._index.get(cid)
            if current is not None:
                self.hit(cid, current, src)
            else:
                self._index.counters[src].hits += 1
        return result.clone() if joined else result

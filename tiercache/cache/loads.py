"""Loads: leases on chunks of a slot tier (promoting them first), copies out (``get``), cost-aware plans.

A leased chunk is held in its tier (never evicted, its slot never reused) until the lease is released or
lapses at its TTL. Bringing a chunk into the tier and copying a chunk out run through the mover with the
index lock released; a load that waits for its promotions brings the chunks its tier lacks in as one batch
(one read of the slower tier, one reservation and commit: :meth:`~tiercache.cache.mover.Mover.move_batch`).
Reads of a tier that is not a slot tier (L3) are single-flight per chunk, so concurrent ``get`` calls of one
chunk share one read. A load that may wait only up to a deadline waits on the
background promotions of a prefetch, which go on after it gives up. When the tier checks loads
(``verify_loads`` of a checksummed slot tier), each leased chunk's bytes are checked against their
commit-time checksum before the lease is handed out: one that fails ends the leased prefix, is dropped and
counted as a miss (its bytes are never served).

Primitives:
    Loads: acquire, release, expire, lease_one, drop_lease, read, hit, plan.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import torch

from tiercache.cache.index import ChunkEntry
from tiercache.cache.leases import Lease
from tiercache.cache.parts import Parts
from tiercache.cache.prefetch import wait_until
from tiercache.cache.results import LoadChunk, LoadTicket, Prefetch
from tiercache.layout import KVLayout
from tiercache.policies.load import CostPlan, PrefillModel, plan_cost_aware
from tiercache.rates import RateEstimator
from tiercache.singleflight import SingleFlight
from tiercache.tiers.base import SlotTier, TierLevel
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


class Loads:
    """Leasing and reading over the index, the lease table and the mover."""

    def __init__(self, parts: Parts, rates: RateEstimator) -> None:
        """Args: the parts shared with the rest of the cache, and the rate estimator."""
        self._lock = parts.lock
        self._clock = parts.clock
        self._tiers = parts.tiers
        self._levels = sorted(parts.tiers)
        self._index = parts.index
        self._leases = parts.leases
        self._mover = parts.mover
        self._writes = parts.writes
        self._writeback = parts.writeback
        self._rates = rates
        self._reap = parts.reap
        self._reads: SingleFlight[torch.Tensor | None] = SingleFlight()

    @property
    def joins(self) -> int:
        """Reads that shared another caller's read."""
        return self._reads.joins

    def acquire(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        cids: Sequence[bytes],
        target: TierLevel,
        ttl: float,
        deadline: float | None,
        background: Prefetch | None,
        check_open: Callable[[], None],
    ) -> LoadTicket:
        """See :meth:`CacheManager.acquire` (arguments already checked).

        Args:
            deadline: None: bring each chunk in as long as it takes; else (``time.monotonic``) wait for the
                promotions of ``background`` up to it (none at all without ``background``).
        """
        with self._lock:
            check_open()
            self._index.next_tick()
            now = self._clock()
            self._reap(now)
            lease = Lease(target, [], now + ttl)
            lease_id = self._leases.new_id()
            self._leases.add_lease(lease_id, lease)
        chunks: list[LoadChunk] = []
        tier = self._tiers[target]
        assert isinstance(tier, SlotTier)
        verify = isinstance(tier, SlotPoolTier) and tier.verify_loads  # asked once, not per chunk
        try:
            promoted = self._promote_together(cids, target) if deadline is None else {}
            for i, cid in enumerate(cids):
                bring: Callable[[], bool] | None = None
                if deadline is None:
                    bring = partial(self._mover.move, cid, target)
                elif background is not None and i < len(background.futures):
                    bring = partial(wait_until, background.futures[i], deadline)
                source = self.lease_one(cid, target, lease, bring, counted=cid in promoted)
                if source is None or (verify and not self._verified(cid, target, lease)):
                    break
                source = promoted.get(cid, source)
                slot = tier.slot_of(cid)  # the lease's hold keeps it there: no index lock needed
                assert slot is not None
                chunks.append(LoadChunk(i, bytes(keys[i]), slot, source, partial(tier.view, cid)))
        except BaseException:
            self.release(lease_id)
            raise
        if not chunks:  # loaded tokens count when the engine reports its copy (CacheManager.report_usage)
            self.release(lease_id)
            lease_id = 0
        return LoadTicket(lease_id, namespace_id, target, tuple(chunks), lease.expires_at)

    def _promote_together(self, cids: Sequence[bytes], target: TierLevel) -> dict[bytes, TierLevel]:
        """Promote the chunks of the cached prefix that ``target`` lacks as one batch
        (:meth:`~tiercache.cache.mover.Mover.move_batch`: per chunk, a promotion costs more in bookkeeping
        than in bytes); counts each as a miss of ``target``.

        Returns:
            The tier each of those chunks came from, for the load's per-tier accounting.
        """
        with self._lock:
            found = zip(cids, self._index.cached_prefix(cids), strict=False)
            missing = {cid: entry.fastest for cid, entry in found if not entry.has_copy(target)}
            self._index.counters[target].misses += len(missing)
        if len(missing) > 1:
            self._mover.move_batch(list(missing), target)
        return missing

    def _verified(self, cid: bytes, level: TierLevel, lease: Lease) -> bool:
        """Check a just-leased chunk's bytes when the tier checks loads; one that fails leaves the lease and
        is dropped as a miss (the lease's hold keeps it in place while it is checked)."""
        tier = self._tiers[level]
        if not isinstance(tier, SlotPoolTier) or not tier.verify_loads or tier.verify(cid):
            return True
        with self._lock:
            lease.chunk_ids.remove(cid)
            self._mover.release_hold(cid, level)
            self._mover.lost(cid, level)
        return False

    def release(self, lease_id: int) -> bool:
        """See :meth:`CacheManager.release`."""
        with self._lock:
            lease = self._leases.take_lease(lease_id)
            if lease is None:
                return False
            self.drop_lease(lease)
            return True

    def expire(self, leases: Sequence[tuple[int, Lease]]) -> None:
        """End the holds of leases the table reaped at their TTL (call under the lock)."""
        for lease_id, lease in leases:
            self.drop_lease(lease)
            logger.warning(
                "lease %d on %d chunks in %s expired", lease_id, len(lease.chunk_ids), lease.level.name
            )

    def plan(
        self, cids: Sequence[bytes], target: TierLevel, layout: KVLayout, prefill: PrefillModel
    ) -> CostPlan:
        """See :meth:`CacheManager.plan_load` (arguments already checked)."""
        nbytes = layout.chunk_bytes
        with self._lock:
            sources = [entry.fastest for entry in self._index.cached_prefix(cids)]
        copy_out = self._rates.load_seconds(target, nbytes)

        def chunk_seconds(source: TierLevel) -> float:
            bring = 0.0 if source == target else self._rates.load_seconds(source, nbytes)
            return bring + copy_out

        return plan_cost_aware(sources, layout.chunk_tokens, chunk_seconds, prefill)

    def hit(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> None:
        """Count a read served by ``level`` and apply the write policy's on-hit rule (under the lock)."""
        if self._writes.on_hit(self._index.record_hit(cid, entry, level)):
            self._writeback.schedule(cid)

    def lease_one(
        self,
        cid: bytes,
        level: TierLevel,
        lease: Lease,
        bring: Callable[[], bool] | None,
        counted: bool = False,
    ) -> TierLevel | None:
        """Add one chunk to a lease, bringing it into ``level`` first (``bring``) when needed.

        ``counted``: its miss of ``level`` is counted already (it was found missing before a batch).

        Returns:
            The tier the bytes came from (``level``, or the tier promoted from); None when not leased.
        """
        with self._lock:
            entry = self._index.visible(cid)
            if entry is None:
                self._index.counters[level].misses += 0 if counted else 1
                return None
            if entry.has_copy(level):
                self._take(cid, entry, level, lease)
                return level
            source = entry.fastest
            self._index.counters[level].misses += 0 if counted else 1
        if bring is None or not bring():
            return None
        with self._lock:
            entry = self._index.visible(cid)
            if entry is None or not entry.has_copy(level):
                return None
            self._take(cid, entry, level, lease)
            return source

    def drop_lease(self, lease: Lease) -> None:
        """End a lease's holds (call under the lock)."""
        for cid in lease.chunk_ids:
            self._mover.release_hold(cid, lease.level)

    def _take(self, cid: bytes, entry: ChunkEntry, level: TierLevel, lease: Lease) -> None:
        self._index.hold(cid, entry, level)
        lease.chunk_ids.append(cid)
        if self._writes.on_hit(self._index.read(cid, entry, level)):
            self._writeback.schedule(cid)

    def read(self, cid: bytes, check_open: Callable[[], None]) -> torch.Tensor | None:
        """A CPU copy of a cached chunk from the fastest tier holding it, or None."""
        with self._lock:
            check_open()
            self._index.next_tick()
            entry = self._index.visible(cid)
            src = entry.fastest if entry is not None else None
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
                if current is not None and current.has_copy(src):
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

"""Room in a tier: evictions in policy order, and the demotions of victims a slower tier keeps.

:meth:`Room.reserve` makes room in a tier and reserves slots there, all or nothing. Victims that need no
demotion are evicted together under the index lock (one tier delete for them all); a victim the write policy
keeps in a slower tier is demoted with the lock released (through the mover, so the demotion is single-flight
with any other move of it), then dropped; the victims one reservation must demote go down together (one
batch of the mover: one write into the slower tier for them all). A failed demotion never fails the
reservation: the victim's room is made anyway and its loss is counted in the tier's ``dropped_chunks`` and
logged at WARNING.

Primitives:
    Room: reserve, reserve_from, drop, dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.space import Space
from tiercache.errors import CapacityError
from tiercache.policies import WritePolicy
from tiercache.tiers.base import StorageTier, TierLevel, WriteSlot

logger = logging.getLogger(__name__)


class Room:
    """Makes room in the cache's tiers for reservations, keeping index and tiers consistent."""

    def __init__(
        self,
        lock: threading.RLock,
        tiers: Mapping[TierLevel, StorageTier],
        index: Index,
        space: Space,
        writes: WritePolicy,
        clock: Callable[[], float],
        reap: Callable[[float], None],
        copying: set[tuple[bytes, TierLevel]],
        demote: Callable[[Sequence[bytes], TierLevel], Mapping[bytes, str | None]],
    ) -> None:
        """Args: the cache's index lock, tiers, index, victim queues, write policy, clock, ``reap`` (reclaims
        expired leases and tickets; called under the lock before evicting), the mover's copies in flight
        (read under the lock), and ``demote`` (copies held victims into a slower tier together; per victim,
        the reason it could not, or None)."""
        self._lock = lock
        self._tiers = tiers
        self._levels = sorted(tiers)
        self._index = index
        self._space = space
        self._writes = writes
        self._clock = clock
        self._reap = reap
        self._copying = copying
        self._demote = demote

    def drop(self, cid: bytes, entry: ChunkEntry, level: TierLevel, evicted: bool) -> None:
        """Delete a copy from its tier and from the index. Call under the lock."""
        self._tiers[level].delete([cid])
        self._index.remove_residency(cid, entry, level, evicted)

    def dropped(self, cid: bytes, level: TierLevel, reason: str) -> None:
        """Count and report a copy the cache meant to keep and could not. Call under the lock."""
        self._index.counters[level].dropped_chunks += 1
        logger.warning("dropped chunk %s at %s: %s", cid.hex(), level.name, reason)

    def reserve(self, level: TierLevel, cids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """Make room in ``level`` (evicting in policy order) and reserve slots for ``cids``; all or nothing.

        Call without the lock: a victim that must be demoted is copied down with the lock released.

        Raises:
            CapacityError: not enough is evictable (leased, pinned or younger than the minimum residency).
            ConflictError: a chunk is already present or being written in ``level``.
        """
        tier = self._tiers[level]
        need = sum(tier.charge(s) for s in sizes)
        capacity = tier.usage().capacity_bytes
        if need > capacity:
            raise CapacityError(f"{level.name}: {need} bytes wanted, capacity is {capacity}")
        reaped = False
        while True:
            with self._lock:
                usage = tier.usage()
                if usage.free_bytes >= need:
                    try:
                        return tier.reserve(cids, sizes)
                    except CapacityError:
                        if usage.used_bytes == 0:
                            raise
                        # Free bytes, but no run of pages long enough (fragmented): evict on, so that the
                        # runs of the victims merge with the free ones around them.
                now = self._clock()
                if not reaped:
                    self._reap(now)
                    reaped = True
                    continue
                evicted, demote, below = self._victims(level, now, need - usage.free_bytes)
                if not evicted and not demote:
                    raise CapacityError(
                        f"{level.name}: {need} bytes wanted, {usage.free_bytes} free and nothing else "
                        "evictable (leased, pinned or younger than the minimum residency)"
                    )
                if below is None:
                    continue
                for victim, entry in demote:
                    self._index.hold(victim, entry, level)
                    self._space.leaving.add(victim)
            victims = [victim for victim, _ in demote]
            reasons: Mapping[bytes, str | None] = {}
            failure = "interrupted"
            try:
                reasons = self._demote(victims, below)
            except Exception as exc:  # the victims go all the same (room is made); the losses are counted
                failure = f"{type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    for victim in victims:
                        self._demoted(victim, level, below, reasons.get(victim, failure))

    def _demoted(self, victim: bytes, level: TierLevel, below: TierLevel, reason: str | None) -> None:
        """End a victim's demotion: drop its copy in ``level`` unless someone leased it meanwhile (then it
        stays, and the caller picks another); a victim lost (``reason``: its demotion failed) is counted.
        Call under the lock."""
        self._space.leaving.discard(victim)
        self._index.unhold(victim, level)
        entry = self._index.get(victim)
        if entry is not None and entry.has_copy(level) and entry.copy(level).holds == 0:
            last_use = entry.copy(level).last_access
            self.drop(victim, entry, level, evicted=not entry.purged)
            self._space.backdate(victim, entry, below, last_use)
        kept = entry is not None and entry.has_copy(level)
        if reason is not None and not kept and not (entry is not None and entry.purged):
            self.dropped(victim, level, f"demotion into {below.name} failed ({reason})")

    def reserve_from(
        self, target: TierLevel, cids: Sequence[bytes], sizes: Sequence[int]
    ) -> tuple[list[WriteSlot], TierLevel]:
        """Reserve in ``target`` or, failing that, the next slower tiers. Call without the lock.

        Raises:
            CapacityError: no tier at or below ``target`` can make room (the message names each).
        """
        errors = []
        for level in [lv for lv in self._levels if lv >= target]:
            try:
                return self.reserve(level, cids, sizes), level
            except CapacityError as exc:
                errors.append(str(exc))
        raise CapacityError("no tier can hold the chunks: " + "; ".join(errors))

    def _victims(
        self, level: TierLevel, now: float, short: int
    ) -> tuple[int, list[tuple[bytes, ChunkEntry]], TierLevel | None]:
        """Take, in policy order, victims of ``level`` until their charges cover ``short`` bytes (at least one
        victim): those that need no demotion are evicted here, deleted from the tier in one call (one LMDB
        transaction for them all: per victim, a transaction was most of an evicting store's cost at a million
        chunks); those a slower tier keeps are returned, for the caller to demote together. Call under the
        lock.

        A charge is never less than what deleting the chunk frees, so this takes no victim that one eviction
        at a time would not have (``short`` <= 0, a fragmented tier: exactly one).

        Returns:
            ``(evicted, demote, below)``: how many victims were evicted, the victims to demote with their
            entries, and the tier they go to (None when there are none).

        Raises:
            the tier's error when the delete fails: then every victim taken is back in the queue, still
            indexed, and evictable by a later call.
        """
        tier = self._tiers[level]
        taken: list[tuple[bytes, ChunkEntry]] = []
        demote: list[tuple[bytes, ChunkEntry]] = []
        below: TierLevel | None = None
        while short > 0 or not (taken or demote):
            victim = self._space.victim(level, now, self._index.entries, self._index.pinned_namespaces)
            if victim is None:
                break
            entry = self._index.get(victim)
            assert entry is not None
            target = self._demotion_target(victim, entry, level)
            if target is None:
                taken.append((victim, entry))
            else:
                demote.append((victim, entry))
                below = target
            short -= tier.charge(entry.nbytes)
        if taken:
            try:
                tier.delete([cid for cid, _ in taken])
            except BaseException:  # nothing was deleted (one transaction): every victim taken is queued again
                for cid, kept in taken + demote:
                    self._space.refresh(cid, kept)
                raise
            for cid, dropped in taken:
                self._index.remove_residency(cid, dropped, level, True)
        return len(taken), demote, below

    def _demotion_target(self, cid: bytes, entry: ChunkEntry, level: TierLevel) -> TierLevel | None:
        """Where an evicted copy goes: the next slower tier when none holds it and the policy keeps it."""
        slower = [lv for lv in self._levels if lv > level]
        held_below = any(entry.has_copy(lv) or (cid, lv) in self._copying for lv in slower)
        if slower and not held_below and self._writes.on_evict(entry.hits, self._index.is_pinned(entry)):
            return slower[0]
        return None

"""The one data mover: every promotion, demotion, eviction demotion, write-down and copy-out goes through it.

A move of chunk ``c`` into tier ``dst`` is always the same protocol:

1. under the index lock: find the fastest tier ``src`` holding ``c``, hold that copy (it cannot be evicted
   or reused meanwhile) and mark ``(c, dst)`` as being copied;
2. make room in ``dst`` and reserve a not-ready slot (:class:`~tiercache.cache.room.Room`: evictions run
   under the lock, an eviction that must demote its victim runs that demotion through this mover with the
   lock released, then takes the lock again);
3. with the lock released: copy ``src -> dst`` and commit ``dst`` (for L3 the commit is the disk write);
4. under the lock: index the new copy (or, if the source turned out corrupt, abort the reservation and drop
   the lost copy from the index), end the hold and the copying mark.

A reservation made for a move is committed or aborted on every path (a failed read of the source, a commit
that finds the LMDB map full, any exception). A chunk the cache meant to keep and could not (an eviction
whose demotion failed, a write-down that failed) is counted in its tier's ``dropped_chunks`` and logged at
WARNING. A prompt's promotions, and the victims one reservation demotes, run as one batch
(:meth:`Mover.move_batch`): the same protocol, with one reservation, one read of the source tier and one
commit for all the chunks.

Moves are single-flight per ``(chunk, dst)`` (:class:`~tiercache.singleflight.SingleFlight`): concurrent
promotions, write-downs or demotions of one chunk into one tier share one copy. A move into tier ``d`` only
ever waits for moves into tiers slower than ``d`` (the demotions that make room in ``d``), so flights never
wait in a cycle. Copies out to a caller's buffer (``get``) hold the source copy the same way.

Primitives:
    MoveOutcome: what a move did.
    Mover: known, reserve, reserve_from, move, move_many, move_batch, demote, write_down_step, copy_out, drop,
        purge, release_hold, lost; ``storing`` (ids under an open store ticket).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager

import torch

from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.room import Room
from tiercache.cache.space import Space
from tiercache.errors import CapacityError, ConflictError
from tiercache.policies import WritePolicy
from tiercache.rates import RateEstimator
from tiercache.singleflight import SingleFlight
from tiercache.tiers.base import SlotTier, StorageTier, TierLevel, WriteSlot
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _admitted(cid: bytes, dst: TierLevel) -> Iterator[bool]:
    yield True


class MoveOutcome(enum.Enum):
    """What a move did."""

    DONE = enum.auto()  # the chunk is in the target tier (it was there already, or was copied)
    ABSENT = enum.auto()  # not cached (or purged), nothing to copy from, or a copy into the tier is running
    NO_ROOM = enum.auto()  # the target tier could not make room
    LOST = enum.auto()  # the source copy was corrupt (the tier deleted it)


_FAILED: Mapping[MoveOutcome, str] = {MoveOutcome.NO_ROOM: "no room", MoveOutcome.LOST: "source corrupt"}
"""The outcomes of a move that leave a chunk without the copy it was due, and how they are reported."""


class Mover:
    """Moves chunks between tiers and out to callers, keeping index and tiers consistent."""

    def __init__(
        self,
        lock: threading.RLock,
        tiers: Mapping[TierLevel, StorageTier],
        index: Index,
        space: Space,
        writes: WritePolicy,
        rates: RateEstimator,
        clock: Callable[[], float],
        reap: Callable[[float], None],
    ) -> None:
        """Args: the cache's index lock, tiers, index, victim queues, write policy, rate estimator, clock,
        and ``reap`` (reclaims expired leases and tickets; called under the lock before evicting)."""
        self._lock = lock
        self._tiers = tiers
        self._levels = sorted(tiers)
        self._index = index
        self._rates = rates
        self._clock = clock
        self._reap = reap
        self._flights: SingleFlight[MoveOutcome] = SingleFlight()
        self._copying: set[tuple[bytes, TierLevel]] = set()
        self._room = Room(
            lock,
            tiers,
            index,
            space,
            writes,
            clock,
            reap,
            self._copying,
            lambda cids, below: {c: _FAILED.get(o) for c, o in self.move_batch(cids, below).items()},
        )
        self.storing: set[bytes] = set()
        self.admit: Callable[[bytes, TierLevel], AbstractContextManager[bool]] = _admitted
        """Admission of a move (no lock held): a context whose value says whether to make it, held while
        the move runs (:mod:`tiercache.cache.borrowing`: promotions count against their tenant's quota)."""

    @property
    def joins(self) -> int:
        """Moves that shared another caller's copy."""
        return self._flights.joins

    def copying(self) -> set[tuple[bytes, TierLevel]]:
        """Copies in flight as ``(chunk id, target tier)`` (a snapshot; call under the lock)."""
        return set(self._copying)

    # ------------------------------------------------------------------ bookkeeping (lock held)

    def known(self, cid: bytes) -> bool:
        """Cached, or being written into some tier (by a store or by a copy). Call under the lock."""
        return (
            self._index.get(cid) is not None
            or cid in self.storing
            or any((cid, level) in self._copying for level in self._levels)
        )

    def drop(self, cid: bytes, entry: ChunkEntry, level: TierLevel, evicted: bool) -> None:
        """See :meth:`Room.drop`."""
        self._room.drop(cid, entry, level, evicted)

    def purge(self, namespace_id: bytes) -> int:
        """Make every chunk of a namespace invisible and unpin it; delete the copies nobody holds (under the
        lock: held copies go when their last hold ends). Returns how many chunks the namespace had."""
        self._index.pinned_namespaces.discard(namespace_id)
        victims = self._index.of_namespace(namespace_id)
        for cid, entry in victims:
            for level in self._index.purge(entry, cid):
                self.drop(cid, entry, level, evicted=False)
        return len(victims)

    def release_hold(self, cid: bytes, level: TierLevel) -> None:
        """End one hold on a copy; a purged chunk's copy goes when its last hold ends. Call under the lock."""
        if self._index.unhold(cid, level):
            entry = self._index.get(cid)
            assert entry is not None
            self.drop(cid, entry, level, evicted=False)

    def lost(self, cid: bytes, level: TierLevel) -> None:
        """A tier no longer has a chunk the index said it had (a corrupt value it deleted). Under the lock."""
        entry = self._index.get(cid)
        if entry is not None and entry.has_copy(level):
            self._index.counters[level].misses += 1
            self.drop(cid, entry, level, evicted=False)

    # ------------------------------------------------------------------ space (lock not held)

    def reserve(self, level: TierLevel, cids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """See :meth:`Room.reserve`."""
        return self._room.reserve(level, cids, sizes)

    def reserve_from(
        self, target: TierLevel, cids: Sequence[bytes], sizes: Sequence[int]
    ) -> tuple[list[WriteSlot], TierLevel]:
        """See :meth:`Room.reserve_from`."""
        return self._room.reserve_from(target, cids, sizes)

    # ------------------------------------------------------------------ moves (lock not held)

    def move(self, cid: bytes, dst: TierLevel, observe: bool = True) -> bool:
        """Bring a cached chunk into ``dst`` from the fastest tier holding it. True when it is there now.

        A promotion first passes :attr:`admit` (the chunk's tenant's quota of ``dst``): one it refuses is
        not made (False).

        Args:
            observe: time the read of the source and feed it to the rate estimator.
        """
        with self.admit(cid, dst) as admitted:
            return admitted and self.move_outcome(cid, dst, observe) is MoveOutcome.DONE

    def move_many(self, cids: Sequence[bytes], dst: TierLevel, check_open: Callable[[], None]) -> int:
        """Bring chunks into ``dst`` as one cache operation (one tick); returns how many are there now."""
        with self._lock:
            check_open()
            self._index.next_tick()
        return sum(self.move(cid, dst) for cid in cids)

    def move_outcome(
        self, cid: bytes, dst: TierLevel, observe: bool = True, keep_recency: bool = False
    ) -> MoveOutcome:
        """Like :meth:`move`, with the reason a move did not happen.

        ``keep_recency``: the new copy takes the source copy's last access, not the current tick (a
        write-down: no use of the chunk, see :meth:`write_down_step`).
        """
        return self._flights.run((cid, dst), lambda: self._copy(cid, dst, observe, keep_recency))[0]

    def demote(self, cids: Sequence[bytes], target: TierLevel, check_open: Callable[[], None]) -> int:
        """Copy chunks down into ``target`` when needed, then drop their unheld copies in faster tiers.

        One cache operation (one tick; expired leases are reaped first, so their copies can go). Returns how
        many chunks are in ``target`` now (chunks only in slower tiers are left alone).
        """
        with self._lock:
            check_open()
            self._index.next_tick()
            self._reap(self._clock())
        moved = 0
        for cid in cids:
            with self._lock:
                entry = self._index.get(cid)
                if entry is None:
                    continue
                needs_copy = not entry.has_copy(target)
                if needs_copy and not any(lv < target for lv in entry.levels):
                    continue
            if needs_copy and not self.move(cid, target):
                continue
            moved += 1
            with self._lock:
                entry = self._index.get(cid)
                if entry is None:
                    continue
                for lv in [r.level for r in entry.copies() if r.level < target and r.holds == 0]:
                    self.drop(cid, entry, lv, evicted=False)
        return moved

    def write_down_step(self, cid: bytes) -> MoveOutcome | None:
        """Copy a chunk into the next slower tier lacking it; None when no tier lacks it.

        A write-down that finds no room, loses its source or raises is counted as a dropped chunk of the
        target tier (the exception propagates).

        The copy keeps its source's recency: a write-down is no use of the chunk, and the tick of whatever
        operation the write-back worker ran in would rank it by the worker's timing. (A demotion on
        eviction takes it only once the evicted copy is dropped (:meth:`reserve`): until then the new
        copy ranks as one a faster tier holds, and with an old tick it would be the slower tier's first
        victim in that window, so that the chunk would leave both tiers.)
        """
        with self._lock:
            entry = self._index.visible(cid)
            if entry is None:
                return None
            src = entry.fastest
            missing = [
                lv
                for lv in self._levels
                if lv > src and not entry.has_copy(lv) and (cid, lv) not in self._copying
            ]
            if not missing:
                return None
        dst = missing[0]
        try:
            outcome = self.move_outcome(cid, dst, observe=False, keep_recency=True)
        except Exception as exc:
            with self._lock:
                self._room.dropped(cid, dst, f"write-down failed ({type(exc).__name__}: {exc})")
            raise
        reason = _FAILED.get(outcome)
        if reason is not None:
            with self._lock:
                self._room.dropped(cid, dst, f"write-down failed ({reason})")
        return outcome

    def _copy(self, cid: bytes, dst: TierLevel, observe: bool, keep_recency: bool) -> MoveOutcome:
        with self._lock:
            begun = self._begin(cid, dst)
            if isinstance(begun, MoveOutcome):
                return begun
            entry, src = begun
        try:
            try:
                (ws,) = self.reserve(dst, [cid], [entry.nbytes])
            except (CapacityError, ConflictError) as exc:
                logger.debug("no room for %s in %s: %s", cid.hex(), dst.name, exc)
                return MoveOutcome.NO_ROOM
            try:
                started = time.perf_counter()
                (ok,) = self._copy_bytes([cid], src, dst, [ws])
                elapsed = time.perf_counter() - started
            except CapacityError as exc:  # the commit found no room (an L3 map full): nothing was written
                logger.debug("no room to commit %s in %s: %s", cid.hex(), dst.name, exc)
                return MoveOutcome.NO_ROOM
            with self._lock:
                if ok and observe:
                    self._rates.observe(src, entry.nbytes, elapsed)
                return self._land(cid, entry, src, dst, ok, keep_recency)
        finally:
            with self._lock:
                self._end(cid, src, dst)

    def move_batch(self, cids: Sequence[bytes], dst: TierLevel) -> dict[bytes, MoveOutcome]:
        """Move chunks into ``dst`` together: a prompt's promotions, or the victims one reservation demotes.

        Per chunk, a move costs more in bookkeeping (a reservation and its evictions, a read transaction,
        a commit, the locks) than in bytes, and a write into L3 is one LMDB transaction. Here the chunks that
        one tier holds share one reservation, one read of that tier and one commit. Admission
        (:attr:`admit`) stops at the first chunk it refuses, as a load's leased prefix would. The batch
        leads each chunk's flight that none runs yet, so concurrent moves of its chunks wait for it; the
        chunks it cannot take together (held by another tier than the first, or no room for all at once)
        are moved one by one as :meth:`move` does, and those already in flight are waited for.

        Returns:
            The outcome of each chunk admitted.
        """
        with contextlib.ExitStack() as admissions:
            admitted = []
            for cid in cids:
                if not admissions.enter_context(self.admit(cid, dst)):
                    break
                admitted.append(cid)
            led = self._flights.lead([(cid, dst) for cid in admitted])
            outcomes: dict[bytes, MoveOutcome] = {}
            try:
                outcomes = self._copy_batch([cid for cid, _ in led], dst)
                for cid, _ in led:
                    if cid not in outcomes:
                        outcomes[cid] = self._copy(cid, dst, observe=True, keep_recency=False)
            except BaseException as exc:
                for key in led:
                    self._flights.land(key, outcomes.get(key[0], exc))
                raise
            for key in led:
                self._flights.land(key, outcomes[key[0]])
            for cid in admitted:
                if cid not in outcomes:  # another caller's move of it was running: its outcome
                    outcomes[cid] = self.move_outcome(cid, dst)
            return outcomes

    def _copy_batch(self, cids: Sequence[bytes], dst: TierLevel) -> dict[bytes, MoveOutcome]:
        """Copy the chunks that the same tier as the first holds into ``dst`` at once; the outcome of each
        chunk copied or found not to need a copy (the others are left to the caller)."""
        outcomes: dict[bytes, MoveOutcome] = {}
        begun: dict[bytes, ChunkEntry] = {}
        src: TierLevel | None = None
        with self._lock:
            for cid in cids:
                entry = self._index.visible(cid)
                if entry is not None and src is not None and entry.fastest != src:
                    continue
                started = self._begin(cid, dst)
                if isinstance(started, MoveOutcome):
                    outcomes[cid] = started
                    continue
                begun[cid], src = started
        if src is None:
            return outcomes
        try:
            try:
                slots = self.reserve(dst, list(begun), [entry.nbytes for entry in begun.values()])
            except (CapacityError, ConflictError) as exc:
                logger.debug("no room for %d chunks at once in %s: %s", len(begun), dst.name, exc)
                return outcomes
            try:
                started_s = time.perf_counter()
                oks = self._copy_bytes(list(begun), src, dst, slots)
                elapsed = time.perf_counter() - started_s
            except CapacityError as exc:  # the commit found no room: nothing was written
                logger.debug("no room to commit %d chunks in %s: %s", len(begun), dst.name, exc)
                return outcomes | dict.fromkeys(begun, MoveOutcome.NO_ROOM)
            with self._lock:
                copied = sum(entry.nbytes for entry, ok in zip(begun.values(), oks, strict=True) if ok)
                self._rates.observe(src, copied, elapsed)
                for (cid, entry), ok in zip(begun.items(), oks, strict=True):
                    outcomes[cid] = self._land(cid, entry, src, dst, ok, keep_recency=False)
            return outcomes
        finally:
            with self._lock:
                for cid in begun:
                    self._end(cid, src, dst)

    def _begin(self, cid: bytes, dst: TierLevel) -> tuple[ChunkEntry, TierLevel] | MoveOutcome:
        """Start a move: hold the chunk's fastest copy and mark it being copied into ``dst``; or the outcome
        when there is nothing to copy. Call under the lock; end it with :meth:`_end`."""
        entry = self._index.visible(cid)
        if entry is None:
            return MoveOutcome.ABSENT
        if entry.has_copy(dst):
            return MoveOutcome.DONE
        if (cid, dst) in self._copying:
            return MoveOutcome.ABSENT
        src = entry.fastest
        self._index.hold(cid, entry, src)
        self._copying.add((cid, dst))
        return entry, src

    def _land(
        self, cid: bytes, entry: ChunkEntry, src: TierLevel, dst: TierLevel, ok: bool, keep_recency: bool
    ) -> MoveOutcome:
        """Index a copy committed into ``dst`` (``ok``), or drop the corrupt source copy (its reservation
        aborted). Call under the lock.

        ``keep_recency``: the new copy takes the source copy's last access, not the current tick.
        """
        if not ok:
            self.lost(cid, src)
            return MoveOutcome.LOST
        if entry.purged:  # purged while the copy ran: the new copy must not appear
            self._tiers[dst].delete([cid])
            return MoveOutcome.ABSENT
        tick = entry.copy(src).last_access if keep_recency and entry.has_copy(src) else None
        self._index.add_residency(cid, entry, dst, self._clock(), tick=tick, source=src)
        counters = self._index.counters
        if dst < src:
            counters[dst].promotions += 1
            if not isinstance(self._tiers[src], SlotTier):
                counters[src].hits += 1
        else:
            counters[dst].demotions += 1
        return MoveOutcome.DONE

    def _end(self, cid: bytes, src: TierLevel, dst: TierLevel) -> None:
        """End a move begun by :meth:`_begin`. Call under the lock."""
        self._copying.discard((cid, dst))
        self.release_hold(cid, src)

    def _copy_bytes(
        self, cids: Sequence[bytes], src: TierLevel, dst: TierLevel, slots: Sequence[WriteSlot]
    ) -> list[bool]:
        """Copy held chunks' bytes from ``src`` into their reservations ``slots`` of ``dst`` and commit them
        together; per chunk, False when the source's copy is gone or fails its checksum.

        Every reservation is committed or aborted here, on every way out (a failed read, a full LMDB map
        at commit, any other error): a reservation never outlives its move.

        When ``dst`` sends bytes on from wherever they are (the shared tier) and ``src`` is a slot tier,
        the slots' bytes are checked in place and written from there: no copy through the reservations'
        buffers, and the checksums just verified go with them (not hashed twice). The holds the caller
        took keep the slots from being reused meanwhile.
        """
        source, target = self._tiers[src], self._tiers[dst]
        in_place: list[tuple[torch.Tensor, int | None]] | None = None  # the checked slots' views, checksums
        pending = list(slots)
        try:
            if target.writes_from_sources and isinstance(source, SlotPoolTier):
                views = [source.view(cid) for cid in cids]
                oks = [view is not None and source.verify(cid) for cid, view in zip(cids, views, strict=True)]
                in_place = [
                    (view, source.checksum(cid))
                    for cid, view, ok in zip(cids, views, oks, strict=True)
                    if ok and view is not None
                ]
            else:
                oks = source.read_into(cids, [ws.buffer for ws in slots])
            if not all(oks):
                pending = [ws for ws, ok in zip(slots, oks, strict=True) if ok]
                target.abort([ws for ws, ok in zip(slots, oks, strict=True) if not ok])
            if pending and in_place is not None:
                target.commit_from(pending, [view for view, _ in in_place], [crc for _, crc in in_place])
            elif pending:
                target.commit(pending)
            pending = []
            return oks
        finally:
            if pending:
                target.abort(pending)

    def copy_out(self, cid: bytes, level: TierLevel, out: torch.Tensor, observe: bool) -> bool:
        """Copy ``level``'s copy of a chunk into ``out`` (the copy is held meanwhile; lock not held).

        The caller holds nothing; False when ``level`` no longer holds the chunk or its value was corrupt
        (then it is dropped from the index).
        """
        with self._lock:
            entry = self._index.get(cid)
            if entry is None or not entry.has_copy(level):
                return False
            self._index.hold(cid, entry, level)
        try:
            started = time.perf_counter()
            ok = self._tiers[level].read_into([cid], [out])[0]
            if ok and observe:
                self._rates.observe(level, out.numel(), time.perf_counter() - started)
        finally:
            with self._lock:
                self.release_hold(cid, level)
        if not ok:
            with self._lock:
                self.lost(cid, level)
        return ok

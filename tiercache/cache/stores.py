"""Two-phase stores: reserve invisible space, let the caller fill it, publish or discard it.

A store first claims its chunk ids under the index lock (so that no other store or copy writes them), then
reserves space through the mover with the lock released (room is made by evicting, which may demote), then
files the reservation as a ticket in the lease table. Commit makes chunks visible in the tier and in the
index (the tier's commit, which hashes L2 chunks, with the lock released; the index under it) and applies
the write policy; abort gives the space back, and so does a commit that fails (the error propagates, the
failed slots leave the ticket).

A ticket that expires is refused at commit (:class:`~tiercache.errors.ExpiredError`, FAILED_PRECONDITION on
the wire, naming the ticket and when it expired). Its slots in a tier shared with engine processes (L2)
are quarantined for one more TTL before they can be reserved again: an engine that stalled past the TTL may still be writing into them,
and its late bytes must never land in a slot that was handed on. (A writer later still than that can only
reach its own tenant's pool, and its bytes fail the checksum taken at commit.)

Primitives:
    Stores: begin, fill, commit, abort, discard, discard_all, expire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import torch

from tiercache.cache.index import ChunkEntry
from tiercache.cache.leases import StoreReservation
from tiercache.cache.parts import Parts
from tiercache.cache.results import StoreSlot, StoreTicket
from tiercache.errors import ExpiredError, InvalidArgumentError, NotFoundError
from tiercache.prefill import PrefillCoordinator
from tiercache.tiers.base import TierLevel, WriteSlot
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


class Stores:
    """Store tickets over the index, the lease table and the mover."""

    def __init__(self, parts: Parts, prefill: PrefillCoordinator) -> None:
        """Args: the parts shared with the rest of the cache, and the prefill coordinator."""
        self._lock = parts.lock
        self._clock = parts.clock
        self._tiers = parts.tiers
        self._index = parts.index
        self._leases = parts.leases
        self._mover = parts.mover
        self._writes = parts.writes
        self._writeback = parts.writeback
        self._prefill = prefill
        self._reap = parts.reap

    def begin(
        self,
        namespace_id: bytes,
        keys: Sequence[bytes],
        cids: Sequence[bytes],
        chunk_bytes: int,
        target: TierLevel,
        ttl: float,
        start_depth: int,
        check_open: Callable[[], None],
    ) -> StoreTicket:
        """See :meth:`CacheManager.begin_store` (arguments already checked)."""
        with self._lock:
            check_open()
            self._index.next_tick()
            self._reap(self._clock())
            todo = [i for i, cid in enumerate(cids) if not self._mover.known(cid)]
            claimed = [cids[i] for i in todo]
            self._mover.storing.update(claimed)
            ticket_id = self._leases.new_id()
        try:
            writes: list[WriteSlot] = []
            landed = target
            if todo:
                writes, landed = self._mover.reserve_from(target, claimed, [chunk_bytes] * len(todo))
        except BaseException:
            with self._lock:
                self._mover.storing.difference_update(claimed)
            raise
        with self._lock:
            now = self._clock()
            todo_set = set(todo)
            skipped = tuple(i for i in range(len(cids)) if i not in todo_set)
            slots = tuple(StoreSlot(i, bytes(keys[i]), ws.buffer, ws.slot) for i, ws in zip(todo, writes))
            depths = [start_depth + i for i in todo]
            self._leases.add_store(
                ticket_id, StoreReservation(namespace_id, landed, writes, depths, list(todo), now + ttl, ttl)
            )
            return StoreTicket(ticket_id, namespace_id, landed, slots, skipped, now + ttl)

    def fill(self, ticket: StoreTicket, payloads: Sequence[torch.Tensor]) -> None:
        """Copy whole chunks into a ticket's slots (``payloads`` by chain position); on any failure the
        ticket is aborted before the error propagates, so a half-filled ticket never lingers to its TTL."""
        try:
            for slot in ticket.slots:
                slot.buffer.copy_(payloads[slot.index])
        except BaseException:
            self.abort(ticket.ticket_id)
            raise

    def commit(
        self, ticket_id: int, indices: Sequence[int] | None, checksums: Mapping[int, int] | None = None
    ) -> int:
        """See :meth:`CacheManager.commit_store`. Call without the lock.

        The tier's commit (for L2, the checksum of every chunk: milliseconds for large ones) runs with the
        index lock released, so that other engines' lookups, loads and stores do not wait on it: the chosen
        slots first leave the ticket under the lock (no expiry or abort can take them meanwhile; their ids
        stay claimed in ``mover.storing``), then the tier commits them, then they are filed in the index.
        """
        with self._lock:
            self._index.next_tick()
            now = self._clock()
            self._reap(self._clock())
            store = self._leases.store(ticket_id)
            lapsed = self._leases.lapsed(ticket_id)
            if store is None and lapsed is not None:
                raise ExpiredError(
                    "ticket_id",
                    f"store ticket {ticket_id} expired {now - lapsed:.3f} s ago, before this commit; its slots"
                    " were taken back (store the chunks again, with a longer ttl_s)",
                )
            if store is None:
                raise NotFoundError("ticket_id", f"store ticket {ticket_id} is unknown, finished or expired")
            if indices is None:
                chosen = list(range(len(store.writes)))
            else:
                position = {index: i for i, index in enumerate(store.indices)}
                unknown = [i for i in indices if i not in position]
                if unknown:
                    raise InvalidArgumentError(
                        "indices", f"{unknown} are not open slots of ticket {ticket_id}"
                    )
                chosen = sorted({position[i] for i in indices})
            writes = [store.writes[i] for i in chosen]
            depths = [store.depths[i] for i in chosen]
            known = [None if checksums is None else checksums.get(store.indices[i]) for i in chosen]
            # Committed or failed, these slots leave the ticket now.
            chosen_set = set(chosen)
            keep = [i for i in range(len(store.writes)) if i not in chosen_set]
            store.writes = [store.writes[i] for i in keep]
            store.depths = [store.depths[i] for i in keep]
            store.indices = [store.indices[i] for i in keep]
            if not store.writes:
                self._leases.take_store(ticket_id)
        tier = self._tiers[store.level]
        try:
            if isinstance(tier, SlotPoolTier) and any(k is not None for k in known):
                tier.commit(writes, known)  # checksums taken as the slots were filled: not hashed again
            else:
                tier.commit(writes)
        except BaseException:  # nothing was committed (e.g. an L3 map full): give the space back now
            tier.abort(writes)
            with self._lock:
                self._mover.storing.difference_update(ws.chunk_id for ws in writes)
            raise
        usage = tier.usage()
        fill = usage.used_bytes / usage.capacity_bytes if usage.capacity_bytes > 0 else 1.0
        with self._lock:
            self._mover.storing.difference_update(ws.chunk_id for ws in writes)
            down: list[bytes] = []
            later: list[bytes] = []
            deferring = self._writes.on_idle()
            for ws, depth in zip(writes, depths):
                entry = self._index.add_residency(
                    ws.chunk_id,
                    ChunkEntry(store.namespace_id, ws.chunk_id, depth, ws.nbytes),
                    store.level,
                    now,
                )
                if self._writes.on_commit(self._index.is_pinned(entry), fill):
                    down.append(ws.chunk_id)
                elif deferring:
                    later.append(ws.chunk_id)
            self._writeback.schedule_many(down)
            self._writeback.defer(later)
            self._prefill.published([ws.chunk_id for ws in writes])
            return len(writes)

    def abort(self, ticket_id: int) -> bool:
        """See :meth:`CacheManager.abort_store`."""
        with self._lock:
            store = self._leases.take_store(ticket_id)
            if store is None:
                return False
            self.discard(store)
            return True

    def expire(self, stores: Sequence[tuple[int, StoreReservation]]) -> None:
        """Take back the reservations of tickets the table reaped at their TTL, quarantining slot-tier slots
        for one more TTL, and end the quarantines that are over (call under the lock)."""
        now = self._clock()
        for ticket_id, store in stores:
            self._mover.storing.difference_update(ws.chunk_id for ws in store.writes)
            tier = self._tiers[store.level]
            if isinstance(tier, SlotPoolTier) and tier.shared:
                tier.quarantine(store.writes, now + store.ttl)
            else:
                tier.abort(store.writes)
            logger.warning(
                "store ticket %d expired before commit; %d chunks aborted, their slots quarantined for %.3f s",
                ticket_id,
                len(store.writes),
                store.ttl,
            )
        for tier in self._tiers.values():
            if isinstance(tier, SlotPoolTier):
                tier.release_quarantined(now)

    def discard_all(self) -> None:
        """Close every open ticket and give its reservations back (at shutdown; call under the lock)."""
        for store in self._leases.take_all_stores():
            self.discard(store)

    def discard(self, store: StoreReservation) -> None:
        """Give a closed ticket's reservations back (call under the lock)."""
        self._mover.storing.difference_update(ws.chunk_id for ws in store.writes)
        self._tiers[store.level].abort(store.writes)

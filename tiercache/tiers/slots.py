"""Page-run bookkeeping shared by the L1 and L2 tiers.

A pool is one or more partitions (:mod:`tiercache.tiers.slotspace`) of fixed-size pages, 2-D ``uint8`` rows
``[num_pages, page_bytes]``; a chunk occupies one run of consecutive pages, as many as its bytes need (up to
``max_chunk_bytes``), so any mix of chunk sizes wastes less than a page per chunk. With ``page_bytes`` equal
to the largest chunk (the default) a chunk is one page: the fixed slots of before. A chunk goes to the
partition of its namespace's tenant (:meth:`SlotPoolTier.assign`; the default partition for namespaces
assigned to none), and its ``slot`` is the first page of its run within that partition: its bytes start at
``slot * slot_bytes`` (``slot_bytes`` is the page size).

Each run is free, reserved (being written, invisible to readers), committed, or quarantined (the
reservation of an expired store ticket whose writer may still be writing: kept out of use until a time).
A committed run that is deleted while a copy out of it is in flight is freed only when the copy ends, so a
reader never sees reused pages.

Utilisation: :meth:`SlotPoolTier.usage` reports the chunks' bytes (``payload_bytes``) beside their pages; a
tier that fills while those are under :data:`POOR_UTILISATION` of it warns once (pages too large).

Checked bytes: with ``checksums`` (host pools), commit takes the xxh3-64 checksum of each chunk's bytes, and
every copy out of the tier is checked against it over the bytes that left (:mod:`.slot_copies`: copy and hash
in one pass); :meth:`SlotPoolTier.verify` checks a chunk in place (a load out of shared memory);
``commit_from`` takes a checksum the caller already holds. A chunk that fails is deleted, counted in
``corrupt_reads`` and reported absent, so it is a miss and never served.

Primitives:
    SlotPoolTier: the :class:`~tiercache.tiers.base.SlotTier` implementation over page runs; ``assign``,
        ``verify``, ``quarantine`` / ``release_quarantined``, ``partition_of``.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np
import torch

from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.keys import NAMESPACE_ID_BYTES
from tiercache.tiers.base import (
    SlotTier,
    TierLevel,
    TierUsage,
    WriteSlot,
    check_batch,
    check_checksums,
    check_sources,
)
from tiercache.tiers.pages import CommittedRun, Run, check_dst, checksum_of, poor_utilisation
from tiercache.tiers.slot_copies import CopyPool, copy_in, copy_out, copy_workers
from tiercache.tiers.slotspace import DEFAULT_PARTITION, PartitionBacking, SlotSpace

logger = logging.getLogger(__name__)

_Checks = Sequence[int | None] | None


class SlotPoolTier(SlotTier):
    """Runs of pages over preallocated rows; the L1 and L2 tiers only decide where those rows live."""

    shared = False
    """Whether engine processes write into this tier's slots themselves (then an expired store ticket's
    slots are quarantined: see :mod:`tiercache.cache.stores`)."""

    def __init__(
        self,
        level: TierLevel,
        pool: torch.Tensor,
        checksums: bool = False,
        backing: PartitionBacking | None = None,
        verify_loads: bool = False,
        max_chunk_bytes: int | None = None,
        copy_threads: int | None = None,
    ) -> None:
        """Wrap a page tensor.

        Args:
            level: which tier this is.
            pool: 2-D ``uint8`` tensor ``[num_pages, page_bytes]`` (the default partition); the tier owns it
                from now on.
            checksums: take a checksum of each chunk at commit and check every copy out against it (CPU
                pools only).
            backing: makes the partitions of tenants other than the default one (None: one partition).
            verify_loads: the cache checks a chunk's bytes (:meth:`verify`) before it leases them to a
                reader (needs ``checksums``).
            max_chunk_bytes: the largest chunk (None: one page); a multiple of pages is not needed.
            copy_threads: helpers for a large batch's copies (None: :func:`~.slot_copies.copy_workers`).
        """
        if pool.dtype != torch.uint8 or pool.dim() != 2 or pool.shape[0] == 0:
            raise InvalidArgumentError("pool", "must be a non-empty 2-D uint8 tensor [num_pages, page_bytes]")
        if checksums and pool.device.type != "cpu":
            raise InvalidArgumentError("checksums", f"only CPU pools are checksummed, not {pool.device}")
        self.level = level
        self.num_slots = self.num_pages = int(pool.shape[0])
        self.slot_bytes = self.page_bytes = int(pool.shape[1])
        self.max_chunk_bytes = self.page_bytes if max_chunk_bytes is None else max_chunk_bytes
        if not 0 < self.max_chunk_bytes <= self.num_pages * self.page_bytes:
            raise InvalidArgumentError(
                "max_chunk_bytes", f"{self.max_chunk_bytes} does not fit a pool of {pool.numel()} bytes"
            )
        self.checksums = checksums
        self.verify_loads = verify_loads and checksums
        self._pool = pool
        self._space = SlotSpace(pool, backing)
        self._lock = threading.Lock()
        self._assigned: dict[bytes, str] = {}
        self._committed: OrderedDict[bytes, CommittedRun] = OrderedDict()
        self._reserved: dict[int, tuple[bytes, Run, int, int]] = {}  # token -> (id, where, pages, nbytes)
        self._reserved_ids: set[bytes] = set()
        self._readers: dict[Run, int] = {}
        self._free_after_read: dict[Run, int] = {}  # run -> pages
        self._quarantine: list[tuple[float, str, int, int]] = []  # (until, partition, first page, pages)
        self._tokens = itertools.count(1)
        self._corrupt = 0
        self._used_pages = 0  # committed
        self._held_pages = 0  # reserved or quarantined
        self._payload = 0  # bytes of the committed chunks
        self._reserved_payload = 0
        self._warned = False
        workers = copy_workers() if copy_threads is None else copy_threads
        self._copies = CopyPool(0 if pool.is_cuda else workers, f"tiercache-{level.name.lower()}-copy")

    @property
    def device(self) -> torch.device:
        """Device of the slot tensor."""
        return self._pool.device

    def assign(self, namespace_id: bytes, key: str) -> str:
        """Store the chunks of ``namespace_id`` in partition ``key`` from now on (a tenant's pool); returns
        the partition actually used (the default one when this tier has a single partition).

        Call before the namespace has chunks here: a chunk stays in the partition it was stored in.
        """
        with self._lock:
            part = self._make_partition(key)
            self._assigned[bytes(namespace_id)] = part
            return part

    def _make_partition(self, key: str) -> str:
        part = self._space.partition(key)
        self._space.rows(part)
        return part

    def partition(self, key: str) -> str:
        """The partition of tenant ``key``, made now if it does not exist yet."""
        with self._lock:
            return self._make_partition(key)

    def partition_of(self, chunk_id: bytes) -> str:
        """The partition the chunks of ``chunk_id``'s namespace go to."""
        return self._assigned.get(bytes(chunk_id[:NAMESPACE_ID_BYTES]), DEFAULT_PARTITION)

    def charge(self, nbytes: int) -> int:
        """A chunk occupies whole pages: as many as its bytes need."""
        return self._pages(nbytes) * self.page_bytes

    def _pages(self, nbytes: int) -> int:
        if nbytes > self.max_chunk_bytes:
            raise InvalidArgumentError(
                "nbytes", f"{nbytes} bytes exceed the slot size {self.max_chunk_bytes}"
            )
        return -(-nbytes // self.page_bytes)

    def _row(self, where: Run, nbytes: int) -> torch.Tensor:
        start = where[1] * self.page_bytes
        return self._space.flat(where[0])[start : start + nbytes]

    def _host_row(self, where: Run, nbytes: int) -> np.ndarray:
        """:meth:`_row` as an array (a host pool only): no tensor op on the per-chunk path."""
        start = where[1] * self.page_bytes
        return self._space.array(where[0])[start : start + nbytes]

    def _rows(
        self, where: Run, nbytes: int
    ) -> tuple[Callable[[], np.ndarray] | None, Callable[[], torch.Tensor]]:
        """The run as an array (None for a GPU pool) and as a tensor, each made when a copy needs it."""
        host = None if self._pool.is_cuda else functools.partial(self._host_row, where, nbytes)
        return host, functools.partial(self._row, where, nbytes)

    def reserve(self, chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """See :meth:`StorageTier.reserve`."""
        check_batch(chunk_ids, sizes)
        pages = [self._pages(size) for size in sizes]
        with self._lock:
            for cid in chunk_ids:
                if cid in self._committed or cid in self._reserved_ids:
                    raise ConflictError(
                        f"chunk {cid.hex()} is already present or being written in {self.level.name}"
                    )
            free = self._space.free_pages()
            if sum(pages) > free:
                self._check_utilisation(sum(pages))
                raise CapacityError(
                    f"{self.level.name}: {sum(pages)} pages wanted, {free} free of {self.num_pages}"
                )
            taken: list[Run] = []
            try:
                for cid, count in zip(chunk_ids, pages):
                    part = self.partition_of(cid)
                    taken.append((part, self._space.take(part, count)))
            except CapacityError as exc:
                for where, count in zip(taken, pages):
                    self._space.give(*where, count)
                self._check_utilisation(sum(pages))
                raise CapacityError(f"{self.level.name}: {exc}") from None
            out = []
            for cid, size, count, where in zip(chunk_ids, sizes, pages, taken):
                token = next(self._tokens)
                self._reserved[token] = (cid, where, count, size)
                self._reserved_ids.add(cid)
                self._held_pages += count
                self._reserved_payload += size
                out.append(WriteSlot(cid, size, self._row(where, size), token, where[1]))
            self._check_utilisation(0)
            return out

    def _check_utilisation(self, wanted_pages: int) -> None:
        """Warn once when the tier is full while its chunks' bytes are a poor share of it (under the lock)."""
        if not self._warned:
            held = len(self._committed) + len(self._reserved)
            pages, payload = (
                self._used_pages + self._held_pages + wanted_pages,
                self._payload + self._reserved_payload,
            )
            self._warned = poor_utilisation(
                self.level.name, pages, self.num_pages, self.page_bytes, payload, held
            )

    def commit(self, slots: Sequence[WriteSlot], checksums: _Checks = None) -> None:
        """See :meth:`StorageTier.commit`. With checksums, each chunk's checksum is taken here, except where
        ``checksums`` gives one: taken by whoever filled the slot, block by block as the bytes landed (a
        wrong one makes the chunk read as corrupt, a miss; it never serves other bytes).

        The checksums are taken outside the lock (hashing a large chunk would stall every other store and
        read of the tier): the reservations are checked, hashed, then checked again and committed, so a
        slot aborted or quarantined meanwhile is never committed (ConflictError, nothing committed).
        """
        with self._lock:
            wheres = self._live(slots)
        if self._pool.is_cuda:
            # Writers may have queued copies on the current stream; they must land before readers look.
            torch.cuda.current_stream(self._pool.device).synchronize()
        self._commit(slots, wheres, self._checksums(slots, wheres, checksums))

    def commit_from(
        self, slots: Sequence[WriteSlot], srcs: Sequence[torch.Tensor], checksums: _Checks = None
    ) -> None:
        """See :meth:`StorageTier.commit_from`. With checksums, each source is copied into its slot and
        hashed in one blocked pass (a known checksum is taken as it is: the source is only copied)."""
        check_sources(slots, srcs, checksums)
        if not self.checksums:
            super().commit_from(slots, srcs, checksums)
            return
        with self._lock:
            wheres = self._live(slots)
        known = checksums if checksums is not None else [None] * len(slots)
        calls = [
            functools.partial(copy_in, *self._rows(w, ws.nbytes), src, check)
            for ws, w, src, check in zip(slots, wheres, srcs, known, strict=True)
        ]
        checks: list[int | None] = list(self._copies.run(calls, sum(ws.nbytes for ws in slots)))
        self._commit(slots, wheres, checks)

    def _commit(self, slots: Sequence[WriteSlot], wheres: list[Run], checks: Sequence[int | None]) -> None:
        """Commit live reservations found at ``wheres`` (without the lock) with their checksums."""
        with self._lock:
            if self._live(slots) != wheres:
                raise ConflictError(f"{self.level.name}: a reservation moved while its commit was hashed")
            for ws, where, check in zip(slots, wheres, checks):
                _, _, count, size = self._reserved.pop(ws.token)
                self._reserved_ids.discard(ws.chunk_id)
                self._held_pages -= count
                self._reserved_payload -= size
                self._used_pages += count
                self._payload += ws.nbytes
                self._committed[ws.chunk_id] = CommittedRun(where[0], where[1], count, ws.nbytes, check)

    def _live(self, slots: Sequence[WriteSlot]) -> list[Run]:
        """Where each slot's live reservation is (call under the lock).

        Raises:
            ConflictError: a slot is not a live reservation (committed, aborted or quarantined), or is
                given twice.
        """
        out: list[Run] = []
        tokens: set[int] = set()
        for ws in slots:
            held = self._reserved.get(ws.token)
            if held is None or held[0] != ws.chunk_id or ws.token in tokens:
                raise ConflictError(
                    f"slot for {ws.chunk_id.hex()} is not a live reservation of {self.level.name}"
                )
            tokens.add(ws.token)
            out.append(held[1])
        return out

    def _checksums(
        self, slots: Sequence[WriteSlot], wheres: Sequence[Run], known: _Checks
    ) -> list[int | None]:
        """The commit-time checksum of each reserved chunk's bytes: the ``known`` one, else hashed here
        (None without checksums). Runs without the lock: the rows stay reserved unless aborted, which the
        commit checks afterwards."""
        check_checksums(known, len(slots))
        if not self.checksums:
            return [None] * len(slots)
        given = known if known is not None else [None] * len(slots)
        return [  # a row only where one is hashed (an engine that hashed as it copied sent them all)
            check if check is not None else checksum_of(self._row(where, ws.nbytes))
            for ws, where, check in zip(slots, wheres, given, strict=True)
        ]

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """See :meth:`StorageTier.abort`."""
        with self._lock:
            for where, count in self._unreserve(slots):
                self._held_pages -= count
                self._space.give(*where, count)

    def quarantine(self, slots: Sequence[WriteSlot], until: float) -> None:
        """Abort reservations whose writer may still be writing (an expired store ticket): their slots stay
        out of use until :meth:`release_quarantined` is called with a time at or after ``until``."""
        with self._lock:
            for where, count in self._unreserve(slots):
                heapq.heappush(self._quarantine, (until, *where, count))

    def release_quarantined(self, now: float) -> int:
        """Free the quarantined slots whose time is over; returns how many."""
        freed = 0
        with self._lock:
            while self._quarantine and self._quarantine[0][0] <= now:
                _, part, start, count = heapq.heappop(self._quarantine)
                self._held_pages -= count
                self._space.give(part, start, count)
                freed += 1
        return freed

    def _unreserve(self, slots: Sequence[WriteSlot]) -> list[tuple[Run, int]]:
        """Drop live reservations (their pages stay held: the caller frees or quarantines them)."""
        out = []
        for ws in slots:
            held = self._reserved.get(ws.token)
            if held is None or held[0] != ws.chunk_id:
                continue
            del self._reserved[ws.token]
            self._reserved_ids.discard(ws.chunk_id)
            self._reserved_payload -= held[3]
            out.append((held[1], held[2]))
        return out

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """See :meth:`StorageTier.read_into`. Copies run outside the lock; their slots cannot be reused
        meanwhile. With checksums, a copy whose bytes do not match the commit-time checksum is reported
        absent and the chunk is deleted."""
        if len(chunk_ids) != len(dsts):
            raise InvalidArgumentError("dsts", f"{len(dsts)} destinations for {len(chunk_ids)} chunk ids")
        found: list[CommittedRun | None] = []
        with self._lock:
            for cid, dst in zip(chunk_ids, dsts):
                entry = self._committed.get(cid)
                if entry is not None:
                    check_dst(dst, entry.nbytes)
            for cid in chunk_ids:
                entry = self._committed.get(cid)
                found.append(entry)
                if entry is not None:
                    self._committed.move_to_end(cid)
                    self._readers[entry.where] = self._readers.get(entry.where, 0) + 1
        ok = [entry is not None for entry in found]
        try:
            present = [(i, e, dst) for i, (e, dst) in enumerate(zip(found, dsts)) if e is not None]
            calls = [
                functools.partial(copy_out, *self._rows(e.where, e.nbytes), dst, e.nbytes, e.checksum)
                for _, e, dst in present
            ]
            for (i, _, _), good in zip(
                present, self._copies.run(calls, sum(e.nbytes for _, e, _ in present))
            ):
                ok[i] = good
        finally:
            with self._lock:
                for entry in found:
                    if entry is not None:
                        self._end_read(entry.where)
                for cid, entry, good in zip(chunk_ids, found, ok):
                    if entry is not None and not good:
                        self._corrupted(cid, entry)
        return ok

    def checksum(self, chunk_id: bytes) -> int | None:
        """A committed chunk's commit-time checksum (None without checksums, or for an absent chunk): after
        :meth:`verify` succeeded, the checksum of the bytes in its slot."""
        with self._lock:
            entry = self._committed.get(chunk_id)
        return None if entry is None else entry.checksum

    def verify(self, chunk_id: bytes) -> bool:
        """Check a committed chunk's bytes in place against its commit-time checksum (True without
        checksums). A chunk that fails is deleted and counted; False also when it is absent.

        The caller keeps the chunk from being deleted meanwhile (a lease or a hold).
        """
        with self._lock:
            entry = self._committed.get(chunk_id)
        if entry is None:
            return False
        if entry.checksum is None or checksum_of(self._row(entry.where, entry.nbytes)) == entry.checksum:
            return True
        with self._lock:
            self._corrupted(chunk_id, entry)
        return False

    def _corrupted(self, cid: bytes, entry: CommittedRun) -> None:
        """Drop a chunk whose bytes failed their checksum (call under the lock)."""
        if self._committed.get(cid) is not entry:
            return
        self._corrupt += 1
        where = f"page {entry.slot} of partition {entry.part!r}"
        logger.warning("%s chunk %s failed its checksum (%s); dropping it", self.level.name, cid.hex(), where)
        self._delete_entry(cid)

    def _end_read(self, where: Run) -> None:
        left = self._readers[where] - 1
        if left:
            self._readers[where] = left
            return
        del self._readers[where]
        count = self._free_after_read.pop(where, 0)
        if count:
            self._space.give(*where, count)

    def contains(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        """See :meth:`StorageTier.contains`."""
        with self._lock:
            return [cid in self._committed for cid in chunk_ids]

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """See :meth:`StorageTier.delete`."""
        with self._lock:
            return sum(self._delete_entry(cid) for cid in chunk_ids)

    def _delete_entry(self, cid: bytes) -> bool:
        entry = self._committed.pop(cid, None)
        if entry is None:
            return False
        self._used_pages -= entry.pages
        self._payload -= entry.nbytes
        if entry.where in self._readers:
            self._free_after_read[entry.where] = entry.pages
        else:
            self._space.give(*entry.where, entry.pages)
        return True

    def entries(self) -> list[tuple[bytes, int]]:
        """See :meth:`StorageTier.entries`."""
        with self._lock:
            return [(cid, e.nbytes) for cid, e in self._committed.items()]

    def usage(self) -> TierUsage:
        """See :meth:`StorageTier.usage`. Used bytes are whole pages; quarantined pages count as reserved."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._committed),
                used_bytes=self._used_pages * self.page_bytes,
                reserved_bytes=self._held_pages * self.page_bytes,
                capacity_bytes=self.num_pages * self.page_bytes,
                corrupt_reads=self._corrupt,
                payload_bytes=self._payload,
            )

    def view(self, chunk_id: bytes) -> torch.Tensor | None:
        """See :meth:`SlotTier.view`."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else self._row(entry.where, entry.nbytes)

    def slot_of(self, chunk_id: bytes) -> int | None:
        """See :meth:`SlotTier.slot_of` (the first page of the chunk's run within its partition)."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else entry.slot

    def close(self) -> None:
        """Forget every chunk; subclasses release the memory."""
        self._copies.close()
        with self._lock:
            self._committed.clear()
            self._reserved.clear()
            self._reserved_ids.clear()
            self._quarantine.clear()
            self._free_after_read.clear()
            self._used_pages = self._held_pages = self._payload = self._reserved_payload = 0
            self._space = SlotSpace(torch.empty((0, self.page_bytes), dtype=torch.uint8))

"""Fixed-size slot bookkeeping shared by the L1 and L2 tiers.

A pool is one or more partitions (:mod:`tiercache.tiers.slotspace`) of 2-D ``uint8`` rows
``[num_slots, slot_bytes]``; a chunk occupies one whole row, so there is no fragmentation: any free slot fits
any chunk. A chunk goes to the partition of its namespace's tenant (:meth:`SlotPoolTier.assign`; the default
partition for namespaces assigned to none), and its ``slot`` is the row within that partition.

Each slot is free, reserved (being written, invisible to readers), committed, or quarantined (the
reservation of an expired store ticket whose writer may still be writing: kept out of use until a time).
A committed slot that is deleted while a copy out of it is in flight is freed only when the copy ends, so a
reader never sees a reused slot.

Checked bytes: with ``checksums`` (host pools), commit takes the xxh3-64 checksum of each chunk's bytes, and
every copy out of the tier (demotion, write-down, a copy to a caller) is checked against it over the bytes
that left; :meth:`SlotPoolTier.verify` checks a chunk in place (a load out of shared memory). A chunk that
fails is deleted, counted in ``corrupt_reads`` and reported absent, so it is a miss and never served.

Primitives:
    SlotPoolTier: the :class:`~tiercache.tiers.base.SlotTier` implementation over slot rows; ``assign``,
        ``verify``, ``quarantine`` / ``release_quarantined``, ``partition_of``.
    check_dst: the check of a copy's destination.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.keys import NAMESPACE_ID_BYTES
from tiercache.tiers.base import SlotTier, TierLevel, TierUsage, WriteSlot, check_batch
from tiercache.tiers.slotspace import DEFAULT_PARTITION, PartitionBacking, SlotSpace

logger = logging.getLogger(__name__)

_Slot = tuple[str, int]
"""A slot: (partition key, row)."""


@dataclass(slots=True)
class _Entry:
    part: str
    slot: int
    nbytes: int
    checksum: int | None = None

    @property
    def where(self) -> _Slot:
        return (self.part, self.slot)


def checksum_of(data: torch.Tensor) -> int:
    """The xxh3-64 checksum of a CPU ``uint8`` tensor's bytes (the same function L3 values carry)."""
    buffer: Any = data.numpy()  # numpy arrays export the buffer protocol; their stubs do not say so
    return xxhash.xxh3_64_intdigest(memoryview(buffer))


def check_dst(dst: torch.Tensor, nbytes: int) -> None:
    """Raise InvalidArgumentError unless ``dst`` is a 1-D uint8 tensor of at least ``nbytes`` bytes."""
    if not isinstance(dst, torch.Tensor) or dst.dtype != torch.uint8 or dst.dim() != 1:
        raise InvalidArgumentError("dsts", "each destination must be a 1-D uint8 tensor")
    if dst.numel() < nbytes:
        raise InvalidArgumentError(
            "dsts", f"destination of {dst.numel()} bytes is smaller than the chunk ({nbytes})"
        )


class SlotPoolTier(SlotTier):
    """Slots over preallocated rows; the L1 and L2 tiers only decide where those rows live."""

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
    ) -> None:
        """Wrap a slot tensor.

        Args:
            level: which tier this is.
            pool: 2-D ``uint8`` tensor ``[num_slots, slot_bytes]`` (the default partition); the tier owns it
                from now on.
            checksums: take a checksum of each chunk at commit and check every copy out against it (CPU
                pools only).
            backing: makes the partitions of tenants other than the default one (None: one partition).
            verify_loads: the cache checks a chunk's bytes (:meth:`verify`) before it leases them to a
                reader (needs ``checksums``).
        """
        if pool.dtype != torch.uint8 or pool.dim() != 2 or pool.shape[0] == 0:
            raise InvalidArgumentError("pool", "must be a non-empty 2-D uint8 tensor [num_slots, slot_bytes]")
        if checksums and pool.device.type != "cpu":
            raise InvalidArgumentError("checksums", f"only CPU pools are checksummed, not {pool.device}")
        self.level = level
        self.num_slots = int(pool.shape[0])
        self.slot_bytes = int(pool.shape[1])
        self.checksums = checksums
        self.verify_loads = verify_loads and checksums
        self._pool = pool
        self._space = SlotSpace(pool, backing)
        self._lock = threading.Lock()
        self._assigned: dict[bytes, str] = {}
        self._committed: OrderedDict[bytes, _Entry] = OrderedDict()
        self._reserved: dict[int, tuple[bytes, _Slot]] = {}
        self._reserved_ids: set[bytes] = set()
        self._readers: dict[_Slot, int] = {}
        self._free_after_read: set[_Slot] = set()
        self._quarantine: list[tuple[float, str, int]] = []
        self._tokens = itertools.count(1)
        self._corrupt = 0

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
        """A chunk occupies one whole slot."""
        if nbytes > self.slot_bytes:
            raise InvalidArgumentError("nbytes", f"{nbytes} bytes exceed the slot size {self.slot_bytes}")
        return self.slot_bytes

    def _row(self, where: _Slot, nbytes: int) -> torch.Tensor:
        return self._space.rows(where[0])[where[1], :nbytes]

    def reserve(self, chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """See :meth:`StorageTier.reserve`."""
        check_batch(chunk_ids, sizes)
        for size in sizes:
            self.charge(size)
        with self._lock:
            for cid in chunk_ids:
                if cid in self._committed or cid in self._reserved_ids:
                    raise ConflictError(
                        f"chunk {cid.hex()} is already present or being written in {self.level.name}"
                    )
            free = self._space.free_slots()
            if len(chunk_ids) > free:
                raise CapacityError(
                    f"{self.level.name}: {len(chunk_ids)} slots wanted, {free} free of {self.num_slots}"
                )
            out = []
            for cid, size in zip(chunk_ids, sizes):
                part = self.partition_of(cid)
                where = (part, self._space.take(part))
                token = next(self._tokens)
                self._reserved[token] = (cid, where)
                self._reserved_ids.add(cid)
                out.append(WriteSlot(cid, size, self._row(where, size), token, where[1]))
            return out

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        """See :meth:`StorageTier.commit`. With checksums, each chunk's checksum is taken here.

        The checksums are taken outside the lock (hashing a large chunk would stall every other store and
        read of the tier): the reservations are checked, hashed, then checked again and committed, so a
        slot aborted or quarantined meanwhile is never committed (ConflictError, nothing committed).
        """
        with self._lock:
            wheres = self._live(slots)
        if self._pool.is_cuda:
            # Writers may have queued copies on the current stream; they must land before readers look.
            torch.cuda.current_stream(self._pool.device).synchronize()
        checks = self._checksums(slots, wheres)
        with self._lock:
            if self._live(slots) != wheres:
                raise ConflictError(f"{self.level.name}: a reservation moved while its commit was hashed")
            for ws, where, check in zip(slots, wheres, checks):
                del self._reserved[ws.token]
                self._reserved_ids.discard(ws.chunk_id)
                self._committed[ws.chunk_id] = _Entry(where[0], where[1], ws.nbytes, check)

    def _live(self, slots: Sequence[WriteSlot]) -> list[_Slot]:
        """Where each slot's live reservation is (call under the lock).

        Raises:
            ConflictError: a slot is not a live reservation (committed, aborted or quarantined), or is
                given twice.
        """
        out: list[_Slot] = []
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

    def _checksums(self, slots: Sequence[WriteSlot], wheres: Sequence[_Slot]) -> list[int | None]:
        """The commit-time checksum of each reserved chunk's bytes (None without checksums). Runs without
        the lock: the rows stay reserved unless aborted, which the commit checks afterwards."""
        if not self.checksums:
            return [None] * len(slots)
        return [checksum_of(self._row(where, ws.nbytes)) for ws, where in zip(slots, wheres)]

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """See :meth:`StorageTier.abort`."""
        with self._lock:
            for where in self._unreserve(slots):
                self._space.give(*where)

    def quarantine(self, slots: Sequence[WriteSlot], until: float) -> None:
        """Abort reservations whose writer may still be writing (an expired store ticket): their slots stay
        out of use until :meth:`release_quarantined` is called with a time at or after ``until``."""
        with self._lock:
            for where in self._unreserve(slots):
                heapq.heappush(self._quarantine, (until, *where))

    def release_quarantined(self, now: float) -> int:
        """Free the quarantined slots whose time is over; returns how many."""
        freed = 0
        with self._lock:
            while self._quarantine and self._quarantine[0][0] <= now:
                _, part, row = heapq.heappop(self._quarantine)
                self._space.give(part, row)
                freed += 1
        return freed

    def _unreserve(self, slots: Sequence[WriteSlot]) -> list[_Slot]:
        out = []
        for ws in slots:
            held = self._reserved.get(ws.token)
            if held is None or held[0] != ws.chunk_id:
                continue
            del self._reserved[ws.token]
            self._reserved_ids.discard(ws.chunk_id)
            out.append(held[1])
        return out

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """See :meth:`StorageTier.read_into`. Copies run outside the lock; their slots cannot be reused
        meanwhile. With checksums, a copy whose bytes do not match the commit-time checksum is reported
        absent and the chunk is deleted."""
        if len(chunk_ids) != len(dsts):
            raise InvalidArgumentError("dsts", f"{len(dsts)} destinations for {len(chunk_ids)} chunk ids")
        found: list[_Entry | None] = []
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
            for i, (entry, dst) in enumerate(zip(found, dsts)):
                if entry is not None:
                    out = dst[: entry.nbytes]
                    src = self._row(entry.where, entry.nbytes)
                    out.copy_(src)
                    if entry.checksum is not None:
                        ok[i] = checksum_of(out if out.device.type == "cpu" else src) == entry.checksum
        finally:
            with self._lock:
                for entry in found:
                    if entry is not None:
                        self._end_read(entry.where)
                for cid, entry, good in zip(chunk_ids, found, ok):
                    if entry is not None and not good:
                        self._corrupted(cid, entry)
        return ok

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

    def _corrupted(self, cid: bytes, entry: _Entry) -> None:
        """Drop a chunk whose bytes failed their checksum (call under the lock)."""
        if self._committed.get(cid) is not entry:
            return
        self._corrupt += 1
        logger.warning(
            "%s chunk %s failed its checksum (slot %d of partition %r); dropping it",
            self.level.name,
            cid.hex(),
            entry.slot,
            entry.part,
        )
        self._delete_entry(cid)

    def _end_read(self, where: _Slot) -> None:
        left = self._readers[where] - 1
        if left:
            self._readers[where] = left
            return
        del self._readers[where]
        if where in self._free_after_read:
            self._free_after_read.discard(where)
            self._space.give(*where)

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
        if entry.where in self._readers:
            self._free_after_read.add(entry.where)
        else:
            self._space.give(*entry.where)
        return True

    def entries(self) -> list[tuple[bytes, int]]:
        """See :meth:`StorageTier.entries`."""
        with self._lock:
            return [(cid, e.nbytes) for cid, e in self._committed.items()]

    def usage(self) -> TierUsage:
        """See :meth:`StorageTier.usage`. Quarantined slots count as reserved."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._committed),
                used_bytes=len(self._committed) * self.slot_bytes,
                reserved_bytes=(len(self._reserved) + len(self._quarantine)) * self.slot_bytes,
                capacity_bytes=self.num_slots * self.slot_bytes,
                corrupt_reads=self._corrupt,
            )

    def view(self, chunk_id: bytes) -> torch.Tensor | None:
        """See :meth:`SlotTier.view`."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else self._row(entry.where, entry.nbytes)

    def slot_of(self, chunk_id: bytes) -> int | None:
        """See :meth:`SlotTier.slot_of` (the row within the chunk's partition)."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else entry.slot

    def close(self) -> None:
        """Forget every chunk; subclasses release the memory."""
        with self._lock:
            self._committed.clear()
            self._reserved.clear()
            self._reserved_ids.clear()
            self._quarantine.clear()
            self._space = SlotSpace(torch.empty((0, self.slot_bytes), dtype=torch.uint8))

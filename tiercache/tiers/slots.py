"""Fixed-size slot bookkeeping shared by the L1 and L2 tiers.

A pool is one 2-D ``uint8`` tensor ``[num_slots, slot_bytes]``; a chunk occupies one whole slot, so there is
no fragmentation: any free slot fits any chunk. Free slots are kept in a min-heap so that allocation packs
chunks towards the front of the pool.

Each slot is free, reserved (being written, invisible to readers) or committed. A committed slot that is
deleted while a copy out of it is in flight is freed only when the copy ends, so a reader never sees a
reused slot.

Primitives:
    SlotPoolTier: the :class:`~tiercache.tiers.base.SlotTier` implementation over a slot tensor.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.tiers.base import SlotTier, TierLevel, TierUsage, WriteSlot, check_batch


@dataclass(slots=True)
class _Entry:
    slot: int
    nbytes: int


def check_dst(dst: torch.Tensor, nbytes: int) -> None:
    """Raise InvalidArgumentError unless ``dst`` is a 1-D uint8 tensor of at least ``nbytes`` bytes."""
    if not isinstance(dst, torch.Tensor) or dst.dtype != torch.uint8 or dst.dim() != 1:
        raise InvalidArgumentError("dsts", "each destination must be a 1-D uint8 tensor")
    if dst.numel() < nbytes:
        raise InvalidArgumentError(
            "dsts", f"destination of {dst.numel()} bytes is smaller than the chunk ({nbytes})"
        )


class SlotPoolTier(SlotTier):
    """Slots over one preallocated tensor; the L1 and L2 tiers only decide where that tensor lives."""

    def __init__(self, level: TierLevel, pool: torch.Tensor) -> None:
        """Wrap a slot tensor.

        Args:
            level: which tier this is.
            pool: 2-D ``uint8`` tensor ``[num_slots, slot_bytes]``; the tier owns it from now on.
        """
        if pool.dtype != torch.uint8 or pool.dim() != 2 or pool.shape[0] == 0:
            raise InvalidArgumentError("pool", "must be a non-empty 2-D uint8 tensor [num_slots, slot_bytes]")
        self.level = level
        self.num_slots = int(pool.shape[0])
        self.slot_bytes = int(pool.shape[1])
        self._pool = pool
        self._lock = threading.Lock()
        self._free = list(range(self.num_slots))
        heapq.heapify(self._free)
        self._committed: OrderedDict[bytes, _Entry] = OrderedDict()
        self._reserved: dict[int, tuple[bytes, int]] = {}
        self._reserved_ids: set[bytes] = set()
        self._readers: dict[int, int] = {}
        self._free_after_read: set[int] = set()
        self._tokens = itertools.count(1)

    @property
    def device(self) -> torch.device:
        """Device of the slot tensor."""
        return self._pool.device

    def charge(self, nbytes: int) -> int:
        """A chunk occupies one whole slot."""
        if nbytes > self.slot_bytes:
            raise InvalidArgumentError("nbytes", f"{nbytes} bytes exceed the slot size {self.slot_bytes}")
        return self.slot_bytes

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
            if len(chunk_ids) > len(self._free):
                raise CapacityError(
                    f"{self.level.name}: {len(chunk_ids)} slots wanted, {len(self._free)} free of {self.num_slots}"
                )
            out = []
            for cid, size in zip(chunk_ids, sizes):
                slot = heapq.heappop(self._free)
                token = next(self._tokens)
                self._reserved[token] = (cid, slot)
                self._reserved_ids.add(cid)
                out.append(WriteSlot(cid, size, self._pool[slot, :size], token, slot))
            return out

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        """See :meth:`StorageTier.commit`."""
        with self._lock:
            for ws in slots:
                if self._reserved.get(ws.token, (None, -1))[0] != ws.chunk_id:
                    raise ConflictError(
                        f"slot for {ws.chunk_id.hex()} is not a live reservation of {self.level.name}"
                    )
            if self._pool.is_cuda:
                # Writers may have queued copies on the current stream; they must land before readers look.
                torch.cuda.current_stream(self._pool.device).synchronize()
            for ws in slots:
                _, slot = self._reserved.pop(ws.token)
                self._reserved_ids.discard(ws.chunk_id)
                self._committed[ws.chunk_id] = _Entry(slot, ws.nbytes)

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """See :meth:`StorageTier.abort`."""
        with self._lock:
            for ws in slots:
                held = self._reserved.get(ws.token)
                if held is None or held[0] != ws.chunk_id:
                    continue
                del self._reserved[ws.token]
                self._reserved_ids.discard(ws.chunk_id)
                heapq.heappush(self._free, held[1])

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """See :meth:`StorageTier.read_into`. Copies run outside the lock; their slots cannot be reused meanwhile."""
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
                    self._readers[entry.slot] = self._readers.get(entry.slot, 0) + 1
        try:
            for entry, dst in zip(found, dsts):
                if entry is not None:
                    dst[: entry.nbytes].copy_(self._pool[entry.slot, : entry.nbytes])
        finally:
            with self._lock:
                for entry in found:
                    if entry is not None:
                        self._end_read(entry.slot)
        return [entry is not None for entry in found]

    def _end_read(self, slot: int) -> None:
        left = self._readers[slot] - 1
        if left:
            self._readers[slot] = left
            return
        del self._readers[slot]
        if slot in self._free_after_read:
            self._free_after_read.discard(slot)
            heapq.heappush(self._free, slot)

    def contains(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        """See :meth:`StorageTier.contains`."""
        with self._lock:
            return [cid in self._committed for cid in chunk_ids]

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """See :meth:`StorageTier.delete`."""
        removed = 0
        with self._lock:
            for cid in chunk_ids:
                entry = self._committed.pop(cid, None)
                if entry is None:
                    continue
                removed += 1
                if entry.slot in self._readers:
                    self._free_after_read.add(entry.slot)
                else:
                    heapq.heappush(self._free, entry.slot)
        return removed

    def entries(self) -> list[tuple[bytes, int]]:
        """See :meth:`StorageTier.entries`."""
        with self._lock:
            return [(cid, e.nbytes) for cid, e in self._committed.items()]

    def usage(self) -> TierUsage:
        """See :meth:`StorageTier.usage`."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._committed),
                used_bytes=len(self._committed) * self.slot_bytes,
                reserved_bytes=len(self._reserved) * self.slot_bytes,
                capacity_bytes=self.num_slots * self.slot_bytes,
            )

    def view(self, chunk_id: bytes) -> torch.Tensor | None:
        """See :meth:`SlotTier.view`."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else self._pool[entry.slot, : entry.nbytes]

    def slot_of(self, chunk_id: bytes) -> int | None:
        """See :meth:`SlotTier.slot_of`."""
        with self._lock:
            entry = self._committed.get(chunk_id)
            return None if entry is None else entry.slot

    def close(self) -> None:
        """Forget every chunk; subclasses release the memory."""
        with self._lock:
            self._committed.clear()
            self._reserved.clear()
            self._reserved_ids.clear()

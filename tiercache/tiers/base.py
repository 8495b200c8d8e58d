"""The storage-tier protocol: bookkeeping of space and bytes only, never policy.

A tier stores opaque chunks (1-D ``uint8`` torch tensors) under ``CHUNK_ID_BYTES``-long ids. Tiers never
call each other and never decide what to evict: the cache manager moves data between them and chooses
victims. Every method is batch-first.

Writes are two-phase: :meth:`StorageTier.reserve` hands out writable, not-ready buffers; :meth:`StorageTier.commit`
makes them readable atomically per chunk; :meth:`StorageTier.abort` discards them. A reserved but uncommitted
chunk is never visible to :meth:`StorageTier.read_into` or :meth:`StorageTier.contains`.
:meth:`StorageTier.commit_from` commits reservations with bytes from other buffers, as if they had been
copied into the slots first; a tier that sends bytes on from wherever they are (the shared tier:
``writes_from_sources``) skips that copy.

All methods are thread-safe. They may block (LMDB I/O, large copies): a caller on an event loop runs them
in an executor.

Primitives:
    TierLevel: L1 (device HBM), L2 (shared host memory), L3 (LMDB on SSD), SHARED (a Redis / Valkey
        cluster every daemon reads and writes); lower is faster.
    WriteSlot: a reserved, writable buffer for one chunk.
    TierUsage: a snapshot of a tier's space and error counters.
    StorageTier: the protocol (reserve, commit, commit_from, abort, read_into, contains, delete, entries,
        usage, close).
    SlotTier: a tier of fixed-size slots in one buffer, which can also hand out zero-copy views.
    check_batch: the argument checks every tier's ``reserve`` starts with.
    check_sources: the argument checks of ``commit_from``.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiercache.errors import InvalidArgumentError


def check_batch(chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> None:
    """Validate a reserve batch: equal lengths, positive integer sizes, no duplicate ids."""
    if len(chunk_ids) != len(sizes):
        raise InvalidArgumentError("sizes", f"{len(sizes)} sizes for {len(chunk_ids)} chunk ids")
    if len(set(chunk_ids)) != len(chunk_ids):
        raise InvalidArgumentError("chunk_ids", "duplicate chunk id in one batch")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError("sizes", f"must be positive integers, got {size!r}")


def check_checksums(checksums: Sequence[int | None] | None, count: int) -> None:
    """Validate commit checksums: None, or one per slot (``count``), each an unsigned 64-bit int or None."""
    if checksums is None:
        return
    if len(checksums) != count:
        raise InvalidArgumentError("checksums", f"{len(checksums)} checksums for {count} sources")
    for i, value in enumerate(checksums):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64
        ):
            raise InvalidArgumentError(
                "checksums", f"[{i}] must be an unsigned 64-bit int or None, got {value!r}"
            )


def check_sources(
    slots: Sequence[WriteSlot], srcs: Sequence[torch.Tensor], checksums: Sequence[int | None] | None = None
) -> None:
    """Validate ``commit_from`` sources: one 1-D ``uint8`` tensor of exactly ``nbytes`` per slot, and, when
    given, one checksum (an unsigned 64-bit int, or None) per source."""
    if len(slots) != len(srcs):
        raise InvalidArgumentError("srcs", f"{len(srcs)} sources for {len(slots)} slots")
    check_checksums(checksums, len(srcs))
    for i, (slot, src) in enumerate(zip(slots, srcs, strict=True)):
        if not isinstance(src, torch.Tensor) or src.dtype != torch.uint8 or src.dim() != 1:
            raise InvalidArgumentError("srcs", f"[{i}] must be a 1-D uint8 tensor")
        if src.numel() != slot.nbytes:
            raise InvalidArgumentError("srcs", f"[{i}] holds {src.numel()} bytes, its slot {slot.nbytes}")


class TierLevel(enum.IntEnum):
    """Tier identity and order: a lower value is a faster, smaller tier."""

    L1 = 1
    L2 = 2
    L3 = 3
    SHARED = 4


@dataclass(frozen=True, slots=True)
class WriteSlot:
    """A reserved, not-yet-visible chunk buffer.

    Attributes:
        chunk_id: id the chunk will be filed under at commit.
        nbytes: payload size in bytes.
        buffer: writable 1-D ``uint8`` tensor of exactly ``nbytes`` bytes (on the tier's device).
        token: reservation id, unique within the tier; lets the tier tell a stale slot from a live one.
        slot: index of the slot in a slot tier's pool (where another process finds the buffer), else None.
    """

    chunk_id: bytes
    nbytes: int
    buffer: torch.Tensor
    token: int
    slot: int | None = None


@dataclass(frozen=True, slots=True)
class TierUsage:
    """A snapshot of one tier's space.

    Attributes:
        level: which tier.
        chunks: committed chunks.
        used_bytes: bytes held by committed chunks (for slot tiers: committed slots x slot size).
        reserved_bytes: bytes held by reservations not yet committed or aborted.
        capacity_bytes: the bound on ``used_bytes + reserved_bytes``.
        corrupt_reads: reads that found a torn or corrupt value (reported as misses, value deleted).
        errors: calls to a remote store that failed (unreachable, too slow, refused); 0 for local tiers.
        payload_bytes: the committed chunks' own bytes (``used_bytes`` less what rounding to whole slots or
            pages adds; 0 where a tier does not say).
    """

    level: TierLevel
    chunks: int
    used_bytes: int
    reserved_bytes: int
    capacity_bytes: int
    corrupt_reads: int = 0
    errors: int = 0
    payload_bytes: int = 0

    @property
    def free_bytes(self) -> int:
        """Bytes neither committed nor reserved."""
        return self.capacity_bytes - self.used_bytes - self.reserved_bytes


class StorageTier(abc.ABC):
    """A capacity-bounded store of chunks. See the module docstring for the contract."""

    level: TierLevel

    @abc.abstractmethod
    def charge(self, nbytes: int) -> int:
        """Bytes of capacity one chunk of ``nbytes`` payload bytes occupies (a whole slot for slot tiers).

        Raises:
            InvalidArgumentError: ``nbytes`` can never fit in this tier (e.g. larger than a slot).
        """

    @abc.abstractmethod
    def reserve(self, chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """Reserve space for new chunks; all or nothing.

        Args:
            chunk_ids: ids of the chunks; none may be committed or reserved already.
            sizes: payload bytes of each chunk.

        Returns:
            One writable, not-ready slot per id, in order.

        Raises:
            CapacityError: the free space does not hold all of them (nothing is reserved).
            InvalidArgumentError: a size is not positive or exceeds what the tier can hold, ids and sizes
                differ in length, or an id is duplicated.
            ConflictError: an id is already committed or reserved.
        """

    @abc.abstractmethod
    def commit(self, slots: Sequence[WriteSlot]) -> None:
        """Make reserved chunks readable (atomically per chunk; a crash mid-commit leaves none torn).

        Raises:
            ConflictError: a slot is not a live reservation of this tier (already committed/aborted).
        """

    writes_from_sources: bool = False
    """Whether :meth:`commit_from` sends the sources on without copying them into the slots first."""

    def commit_from(
        self,
        slots: Sequence[WriteSlot],
        srcs: Sequence[torch.Tensor],
        checksums: Sequence[int | None] | None = None,
    ) -> None:
        """Commit reservations with the bytes of ``srcs`` (one per slot, exactly its ``nbytes``), as if
        each had been copied into its slot's buffer first; here, it is copied. Sources must not change
        until the call returns.

        ``checksums``: per source, the xxh3-64 checksum of its bytes when the caller has just verified it
        (e.g. a slot checked in place against its commit-time checksum), else None. A tier that stores a
        checksum with each value may take it instead of hashing the source again; a wrong one makes the
        value read as corrupt (a miss), never serves wrong bytes. Here they are not needed.

        Raises:
            InvalidArgumentError: lengths differ, or a source is not a 1-D ``uint8`` tensor of its slot's
                size.
            ConflictError: as :meth:`commit`.
        """
        check_sources(slots, srcs, checksums)
        for slot, src in zip(slots, srcs, strict=True):
            slot.buffer.copy_(src)
        self.commit(slots)

    @abc.abstractmethod
    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """Discard reservations; their space returns to the pool. Unknown or finished slots are ignored."""

    @abc.abstractmethod
    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """Copy committed chunks into caller buffers.

        Args:
            chunk_ids: chunks to read.
            dsts: 1-D ``uint8`` tensors, each at least as long as its chunk (any device).

        Returns:
            Per chunk, True if its bytes were copied; False on a miss (absent, not ready, or corrupt: a
            corrupt value is counted in ``corrupt_reads`` and deleted).

        Raises:
            InvalidArgumentError: a destination is too small or not a 1-D uint8 tensor.
        """

    @abc.abstractmethod
    def contains(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        """Per id, whether a committed chunk is present (reservations do not count)."""

    @abc.abstractmethod
    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """Remove committed chunks; absent ids are ignored. Returns how many were removed."""

    @abc.abstractmethod
    def entries(self) -> list[tuple[bytes, int]]:
        """Committed chunks as ``(chunk_id, nbytes)``, least recently written or read first."""

    @abc.abstractmethod
    def usage(self) -> TierUsage:
        """A snapshot of space and counters."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the tier's resources (idempotent). Persistent tiers keep their committed chunks."""


class SlotTier(StorageTier):
    """A tier of fixed-size slots in one preallocated buffer (L1 and L2); a chunk takes one slot or a run of
    consecutive ones (pages: ``slot_bytes`` is then the page size, and a chunk starts at its first slot).

    Besides copying, it hands out zero-copy views of committed chunks; a caller must hold a lease from the
    cache manager for as long as it uses a view, since a deleted chunk's slot is reused.
    """

    slot_bytes: int
    num_slots: int

    @abc.abstractmethod
    def view(self, chunk_id: bytes) -> torch.Tensor | None:
        """Zero-copy read view (``nbytes`` long) of a committed chunk, or None when absent."""

    @abc.abstractmethod
    def slot_of(self, chunk_id: bytes) -> int | None:
        """Index of the slot holding a committed chunk, or None when absent."""

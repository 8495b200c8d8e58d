"""The L3 tier: chunks in an LMDB environment on SSD, checksummed and optionally zstd-compressed.

One LMDB environment (a directory) holds the stored values and their access order
(:mod:`tiercache.tiers.lmdb_env`); committed chunks survive a restart of the process: opening the
environment again rebuilds the index and the access order (:mod:`tiercache.tiers.lmdb_order`). A value is
a checksummed header followed by a raw or zstd payload (:mod:`tiercache.tiers.values`).

Every read verifies the header checksum, the stored length against the value's real length (a truncated
value fails) and the raw checksum. A value that fails any check is a miss, is counted in
``corrupt_reads`` and is deleted. Opening indexes the chunks from their per-chunk records, or (an older
environment) checks every header and drops malformed values (:mod:`tiercache.tiers.lmdb_scan`).

Durability follows ``LmdbTierConfig.durable`` (see :mod:`tiercache.tiers.lmdb_config`); a torn or damaged
value is never served either way: the checksums turn it into a miss.

Primitives:
    LmdbTierConfig: path, capacity, codec, zstd level, durability and map size of one L3 tier (defined in
        :mod:`tiercache.tiers.lmdb_config`; import it from here).
    LmdbTier: the :class:`~tiercache.tiers.base.StorageTier` over LMDB, with ``flush()`` to persist access
        order; a :class:`~tiercache.tiers.depths.DepthKeeper` (chain depths stored with the values).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import lmdb
import torch
import zstandard

from tiercache.codec import Codec
from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.tiers.base import StorageTier, TierLevel, TierUsage, WriteSlot, check_batch, check_sources
from tiercache.tiers.depths import DepthSource, HeldChunks
from tiercache.tiers.lmdb_config import LmdbTierConfig
from tiercache.tiers.lmdb_env import open_or_recover
from tiercache.tiers.lmdb_io import (
    DiskFullError,
    ReadOutcome,
    StoredValue,
    check_dsts,
    check_ids,
    delete_corrupt,
    delete_values,
    read_values,
    write_order,
    write_values,
)
from tiercache.tiers.lmdb_order import AccessOrder
from tiercache.tiers.reservations import Reservation, ReservationTable, fill
from tiercache.tiers.staging import StagingPool
from tiercache.tiers.values import HEADER_BYTES, encode_staged

__all__ = ["LmdbTier", "LmdbTierConfig"]

logger = logging.getLogger(__name__)

_STAGING_CACHE_BYTES = 256 << 20  # staging buffers kept for reuse after commit or abort
_Checks = Sequence[int | None] | None
_Srcs = Sequence[torch.Tensor] | None


class LmdbTier(StorageTier):
    """The L3 tier: a capacity-bounded, checksummed chunk store in one LMDB environment.

    Space accounting: a committed chunk occupies its stored value (header + payload, possibly compressed);
    a reservation occupies :meth:`charge` (header + raw size, the worst case) until it is committed or
    aborted. The tier never evicts: the cache manager picks victims from :meth:`entries` and deletes them.

    Thread-safety: every method may be called from any thread. One lock guards the in-memory state (index,
    access order, reservations, counters), a second serializes LMDB write transactions (which LMDB
    serializes anyway) so that access-order writes land in order. :meth:`close` waits for reads in progress
    and must not race other calls otherwise.
    """

    level = TierLevel.L3

    def __init__(self, config: LmdbTierConfig) -> None:
        """Open (or create) the environment and rebuild the index from it.

        Args:
            config: the tier's configuration.

        Raises:
            InvalidArgumentError: the config is not an ``LmdbTierConfig``, or the environment cannot be
                opened or read at ``config.path`` (field ``path``).
        """
        if not isinstance(config, LmdbTierConfig):
            raise InvalidArgumentError("config", f"must be an LmdbTierConfig, got {type(config).__name__}")
        self._config = config
        self._capacity = config.capacity_bytes
        self._faults = config.read_faults
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._staging = StagingPool(_STAGING_CACHE_BYTES, payload_offset=HEADER_BYTES)
        self._reservations = ReservationTable("L3")
        self._active_reads = 0
        self._closed = False
        opened = open_or_recover(
            config.path,
            map_size_bytes=config.effective_map_size_bytes,
            durable=config.durable,
            preallocate_bytes=config.preallocate_bytes,
            recover_damaged=config.recover_damaged,
        )
        try:
            self._capacity = config.fitted_capacity(opened.disk_room_bytes)
        except BaseException:
            opened.env.close()
            raise
        self._env = opened.env
        self._dbs = opened.dbs
        self._max_key = opened.max_key_bytes
        self._order = AccessOrder(opened.found.last_seq)
        self._corrupt_reads = opened.found.dropped
        self._depth_source: DepthSource | None = None
        self._index = opened.found.index()  # id -> (stored bytes, payload bytes, depth or None), use order
        self._used, self._payload = opened.found.used_bytes, opened.found.payload_bytes
        if self._used > self._capacity:
            logger.warning("L3 at %s holds %d bytes > capacity %d", config.path, self._used, self._capacity)
        shape = (len(self._index), self._used, self._capacity, config.codec.value, opened.writemap)
        logger.info(
            "opened L3 tier at %s: %d chunks, %d bytes (capacity %d, codec %s, writemap %s)",
            config.path,
            *shape,
        )

    @property
    def config(self) -> LmdbTierConfig:
        """The tier's configuration."""
        return self._config

    def _check_open(self) -> None:
        """Raise ConflictError if closed; call with ``self._lock`` held."""
        if self._closed:
            raise ConflictError(f"L3 tier at {self._config.path} is closed")

    def _flush_locked(self) -> None:
        """Write pending access-order updates; call with ``self._write_lock`` held and the env open."""
        with self._lock:
            pending = self._order.take()
        if not pending:
            return
        try:
            write_order(self._env, self._dbs, pending)
        except BaseException:
            with self._lock:
                self._order.restore(pending, self._index)
            raise

    def _touch(self, chunk_ids: Sequence[bytes]) -> bool:
        """Mark chunks as just used; returns whether the access order is due for a flush."""
        with self._lock:
            for cid in chunk_ids:
                if cid in self._index:  # a plain dict keeps insertion order: re-inserting moves to the end
                    self._index[cid] = self._index.pop(cid)
                    self._order.read(cid)
            return self._order.flush_due

    def _forget(self, chunk_id: bytes) -> None:
        """Drop a deleted chunk from the index, the usage and the pending order; call with the lock held."""
        entry = self._index.pop(chunk_id, None)
        if entry is not None:
            self._used, self._payload = self._used - entry[0], self._payload - entry[1]
        self._order.forget(chunk_id)

    def bind_depths(self, source: DepthSource) -> None:
        """Store ``source(chunk_id)`` with each later commit (called outside this tier's locks)."""
        self._depth_source = source

    def stored_depths(self) -> dict[bytes, int]:
        """The chain depths stored with the committed chunks (chunks stored without one are absent)."""
        with self._lock:
            return {cid: entry[2] for cid, entry in self._index.items() if entry[2] is not None}

    def depth_entries(self) -> HeldChunks:
        """Committed chunks with their stored depths, in :meth:`entries` order (columns built at C speed)."""
        with self._lock:
            self._check_open()
            return HeldChunks.of_index(self._index)

    def charge(self, nbytes: int) -> int:
        """Capacity one chunk of ``nbytes`` payload bytes takes while reserved: header + ``nbytes``.

        A committed chunk takes its stored size, which is never more (zstd is kept only when smaller).

        Raises:
            InvalidArgumentError: ``nbytes`` is not a positive integer or can never fit in this tier.
        """
        return self._config.charge(nbytes, "nbytes", self._capacity)

    def reserve(self, chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """Reserve staging buffers (1-D ``uint8`` CPU tensors) for new chunks; all or nothing.

        Args:
            chunk_ids: ids (``CHUNK_ID_BYTES`` long in practice; at most LMDB's key size), none committed
                or reserved already, no duplicates.
            sizes: payload bytes of each chunk.

        Returns:
            One writable, not-ready slot per id, in order.

        Raises:
            CapacityError: the free space does not hold all of them (nothing is reserved).
            InvalidArgumentError: a size is not positive or can never fit, ids and sizes differ in length,
                an id is empty or longer than LMDB's key size, or an id is duplicated.
            ConflictError: an id is already committed or reserved, or the tier is closed.
        """
        check_batch(chunk_ids, sizes)
        check_ids(chunk_ids)
        for i, cid in enumerate(chunk_ids):
            if not 0 < len(cid) <= self._max_key:
                raise InvalidArgumentError(
                    "chunk_ids", f"[{i}] must be 1..{self._max_key} bytes (LMDB's key limit), got {len(cid)}"
                )
        charges = [self._config.charge(size, "sizes", self._capacity) for size in sizes]
        total = sum(charges)
        if not chunk_ids:
            return []
        with self._lock:
            self._check_open()
            for cid in chunk_ids:
                if cid in self._index:
                    raise ConflictError(f"chunk {cid.hex()} is already committed in L3")
                if self._reservations.is_reserved(cid):
                    raise ConflictError(f"chunk {cid.hex()} is already reserved in L3")
            free = self._capacity - self._used - self._reservations.reserved_bytes
            if total > free:
                raise CapacityError(
                    f"L3 needs {total} bytes for {len(chunk_ids)} chunks, {max(free, 0)} of "
                    f"{self._capacity} are free"
                )
            slots: list[WriteSlot] = []
            try:
                for cid, size, chg in zip(chunk_ids, sizes, charges, strict=True):
                    staging = self._staging.take(HEADER_BYTES + size)
                    slots.append(self._reservations.add(Reservation(cid, size, chg, staging)))
            except BaseException:  # all or nothing: no reservation outlives a failed call
                for res in self._reservations.abort(slots):
                    self._staging.give(res.staging)
                raise
            return slots

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        """Write reserved chunks in one LMDB write transaction; they become readable together.

        Compression runs before the transaction. The reservation is released and the stored size
        (header + payload) is accounted instead. A chunk becomes the most recently used.

        Raises:
            ConflictError: a slot is not a live reservation of this tier (committed, aborted, being
                committed by another call, or given twice), or the tier is closed. Nothing is committed.
            CapacityError: the LMDB map is full. Nothing is committed; the reservations stay live (abort
                them, or free space and commit again).
        """
        self._commit_slots(slots, None, None)

    def commit_from(
        self, slots: Sequence[WriteSlot], srcs: Sequence[torch.Tensor], checksums: _Checks = None
    ) -> None:
        """See :meth:`StorageTier.commit_from`: each source is copied into its staging buffer and hashed in
        the same blocked pass (a known checksum is taken as it is), then committed as :meth:`commit`."""
        check_sources(slots, srcs, checksums)
        self._commit_slots(slots, srcs, checksums)

    def _commit_slots(self, slots: Sequence[WriteSlot], srcs: _Srcs, checks: _Checks) -> None:
        if not slots:
            return
        with self._lock:
            self._check_open()
            tokens, reservations = self._reservations.claim(slots)
        try:
            self._commit(tokens, reservations, fill(reservations, srcs, checks))
        finally:
            with self._lock:
                self._reservations.unclaim(tokens)

    def _commit(self, tokens: list[int], reservations: list[Reservation], checks: list[int | None]) -> None:
        cctx = None
        if self._config.codec is Codec.ZSTD:
            cctx = zstandard.ZstdCompressor(level=self._config.zstd_level)
        values = [encode_staged(r.staging.numpy().data, cctx, c) for r, c in zip(reservations, checks)]
        source = self._depth_source
        depths = [source(res.chunk_id) if source is not None else None for res in reservations]
        with self._write_lock:
            with self._lock:
                self._check_open()
                first = self._order.allocate(len(values))
                pending = self._order.take()
            try:
                write_values(
                    self._env,
                    self._dbs,
                    [StoredValue(r.chunk_id, v, d) for r, v, d in zip(reservations, values, depths)],
                    first,
                    pending,
                )
            except (lmdb.MapFullError, lmdb.DiskError) as exc:
                with self._lock:
                    self._order.restore(pending, self._index)
                full = CapacityError if isinstance(exc, lmdb.MapFullError) else DiskFullError
                raise full(
                    f"L3 LMDB map ({self._config.effective_map_size_bytes} bytes) or disk is full ({exc}); "
                    f"{len(values)} chunks ({sum(len(v) for v in values)} bytes) were not committed"
                ) from exc
            except BaseException:
                with self._lock:
                    self._order.restore(pending, self._index)
                raise
            with self._lock:
                moved = self._order.last_seq != first + len(values) - 1
                for token, res, value, depth in zip(tokens, reservations, values, depths, strict=True):
                    self._index.pop(res.chunk_id, None)  # to the end of the use order
                    self._index[res.chunk_id] = (len(value), res.nbytes, depth)
                    if moved:  # reads touched other chunks meanwhile: this commit is now the latest use
                        self._order.used(res.chunk_id)
                    self._used, self._payload = self._used + len(value), self._payload + res.nbytes
                    self._staging.give(self._reservations.finish(token).staging)

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """Discard reservations; unknown, finished or in-commit slots are ignored."""
        with self._lock:
            for res in self._reservations.abort(slots):
                self._staging.give(res.staging)

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """See :meth:`StorageTier.read_into` (duplicate ids allowed); every checksum is verified.

        The bytes move as :func:`~tiercache.tiers.lmdb_io.read_values` says (raw payloads straight out of
        LMDB's memory map, hashed as they land; a non-CPU destination staged through a CPU tensor). A
        successful read makes the chunk the most recently used.

        Raises:
            InvalidArgumentError: lengths differ, an id is not bytes, or a destination is not a strided
                1-D ``uint8`` tensor or is smaller than its chunk.
            ConflictError: the tier is closed.
        """
        check_dsts(chunk_ids, dsts)
        with self._lock:
            self._check_open()
            sizes = [self._index.get(cid) for cid in chunk_ids]
            for i, (entry, dst) in enumerate(zip(sizes, dsts, strict=True)):
                if entry is not None and dst.numel() < entry[1]:
                    raise InvalidArgumentError(
                        "dsts", f"[{i}] holds {dst.numel()} bytes, chunk {chunk_ids[i].hex()} has {entry[1]}"
                    )
            self._active_reads += 1
        outcome = ReadOutcome([False] * len(chunk_ids), [])
        try:
            wanted = [entry is not None for entry in sizes]
            if any(wanted):
                outcome = read_values(self._env, self._dbs, chunk_ids, dsts, wanted)
        finally:
            with self._lock:
                self._active_reads -= 1
                if self._active_reads == 0:
                    self._idle.notify_all()
        if outcome.corrupt:
            self._drop_corrupt(outcome.corrupt)
        self._faults.inject(sum(entry[0] for entry in sizes if entry is not None))
        hits = [cid for cid, ok in zip(chunk_ids, outcome.copied, strict=True) if ok]
        if hits and self._touch(hits):
            self._flush_quietly()
        return outcome.copied

    def _drop_corrupt(self, chunk_ids: list[bytes]) -> None:
        """Count corrupt reads and delete those values if they are still corrupt (not replaced)."""
        with self._lock:
            self._corrupt_reads += len(set(chunk_ids))
        with self._write_lock:
            with self._lock:
                if self._closed:
                    return
            try:
                removed = delete_corrupt(self._env, self._dbs, chunk_ids)
            except lmdb.MapFullError:
                logger.exception("L3 at %s: map full while deleting corrupt values", self._config.path)
                return
            with self._lock:
                for cid in removed:
                    self._forget(cid)

    def _flush_quietly(self) -> None:
        """Flush the access order from a read; a failure is logged, not raised (the order is a hint)."""
        with self._write_lock:
            with self._lock:
                if self._closed:
                    return
            try:
                self._flush_locked()
            except lmdb.Error:
                logger.exception("L3 at %s: could not persist the access order", self._config.path)

    def contains(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        """Per id, whether a committed chunk is present (reservations do not count).

        Raises:
            InvalidArgumentError: an id is not bytes.
            ConflictError: the tier is closed.
        """
        check_ids(chunk_ids)
        with self._lock:
            self._check_open()
            return [cid in self._index for cid in chunk_ids]

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """Remove committed chunks in one write transaction; absent ids are ignored. Returns how many.

        Raises:
            InvalidArgumentError: an id is not bytes.
            ConflictError: the tier is closed.
            CapacityError: the LMDB map is so full that even a delete cannot run (nothing is removed;
                only possible with an explicit, too small ``map_size_bytes``).
        """
        check_ids(chunk_ids)
        with self._write_lock:
            with self._lock:
                self._check_open()
                present = [cid for cid in dict.fromkeys(chunk_ids) if cid in self._index]
            if not present:
                return 0
            try:
                delete_values(self._env, self._dbs, present)
            except lmdb.MapFullError as exc:
                raise CapacityError(f"L3 LMDB map is full; could not delete {len(present)} chunks") from exc
            with self._lock:
                for cid in present:
                    self._forget(cid)
        return len(present)

    def entries(self) -> list[tuple[bytes, int]]:
        """Committed chunks as ``(chunk_id, nbytes)``, least recently committed or read first.

        Raises:
            ConflictError: the tier is closed.
        """
        with self._lock:
            self._check_open()
            return [(cid, entry[1]) for cid, entry in self._index.items()]

    def usage(self) -> TierUsage:
        """A snapshot of space and counters (``used_bytes`` counts stored headers + payloads)."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._index),
                used_bytes=self._used,
                reserved_bytes=self._reservations.reserved_bytes,
                capacity_bytes=self._capacity,
                corrupt_reads=self._corrupt_reads,
                payload_bytes=self._payload,
            )

    def flush(self) -> None:
        """Persist the access order now (commits and :meth:`close` do so too).

        Raises:
            ConflictError: the tier is closed.
            CapacityError: the LMDB map is full.
        """
        with self._write_lock:
            with self._lock:
                self._check_open()
            try:
                self._flush_locked()
            except lmdb.MapFullError as exc:
                raise CapacityError("L3 LMDB map is full; could not persist the access order") from exc

    def close(self) -> None:
        """Wait for reads in progress, persist the access order, sync and close the environment.

        Idempotent. Committed chunks stay on disk; outstanding reservations are dropped.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while self._active_reads:
                self._idle.wait()
        with self._write_lock:
            try:
                self._flush_locked()
            except lmdb.Error:
                logger.exception("L3 at %s: could not persist the access order at close", self._config.path)
            try:
                self._env.sync(True)
            except lmdb.Error:
                logger.exception("L3 at %s: sync at close failed", self._config.path)
            self._env.close()
            with self._lock:
                self._reservations.clear()
        logger.info("closed L3 tier at %s", self._config.path)

    def __repr__(self) -> str:
        return f"LmdbTier(path={self._config.path!r}, capacity_bytes={self._capacity})"

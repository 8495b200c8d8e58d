"""The shared tier: chunks in a Redis Cluster (or one Redis / Valkey server) that every daemon reads and writes.

When a fleet outgrows one host, each daemon's cache can end in a store the whole fleet shares: a chunk one
host computed is a hit on every other host. The store is the one the field already deploys for KV (Redis
Cluster / Valkey cluster), reached with redis-py (:mod:`tiercache.tiers.shared_client`); it shards,
replicates and evicts by itself (run it with ``maxmemory-policy allkeys-lru``).

Values are L3's self-checking values (:mod:`tiercache.tiers.values`: header, raw or zstd payload,
checksums), kept as a record of two keys in one hash slot, header and payload (see
:mod:`tiercache.tiers.shared_client`), so that a payload goes to the store straight from the buffer it is
in: :meth:`SharedTier.commit_from` writes a chunk from the caller's (or an L2 slot's) bytes without copying
it. A value that fails a check is a miss, is counted in ``corrupt_reads`` and is deleted. A record's keys
are ``key_prefix`` + ``{`` + the chunk id in hex + ``}`` + a part suffix (:func:`store_key`), and a chunk id
starts with the tenant-scoped namespace id (:meth:`~tiercache.keys.Namespace.scoped_id`), so two tenants
never share a key.

The tier is the authority only for what is in the store: :meth:`SharedTier.contains` and
:meth:`SharedTier.read_into` ask the store (so chunks other daemons wrote are found, and chunks the cluster
evicted are misses). What this daemon wrote or read is also kept in a local, recency-ordered view, which is
what :meth:`SharedTier.entries` and ``usage().chunks`` / ``used_bytes`` report (the cluster's own totals
belong to the cluster); a chunk found missing is dropped from the view.

Faults (:mod:`tiercache.tiers.shared_breaker`): a call that fails (node down, timeout, cluster gone) is
counted in ``usage().errors`` and turns the tier off with exponential backoff; while it is off every read
and lookup is a miss at once, a reservation is refused with ``CapacityError`` and a delete forgets locally.
No call waits longer than the configured socket timeouts. Nothing partial is ever served: a record is one
``MSET`` of both keys, read whole (``MGET``) and checked; a record missing a part is a miss. A raw
payload is copied into the caller's buffer and checksummed there block by block as it lands (one pass over
the received bytes); a buffer whose check fails is reported as a miss and its bytes must not be used.

Thread-safety: every method may be called from any thread. One lock guards the local view, reservations
and counters; network calls run without it.

Primitives:
    SharedTierConfig: seed URL(s), capacity, codec, timeouts, backoff (from
        :mod:`tiercache.tiers.shared_config`; import it from here).
    SharedTier: the :class:`~tiercache.tiers.base.StorageTier` over the store; ``available``, ``store_kind``.
    store_key: the base key of a chunk id's record (its hash tag decides the cluster node).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
import zstandard

from tiercache.checksum import copy_checksum
from tiercache.codec import Codec
from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.tiers.base import StorageTier, TierLevel, TierUsage, WriteSlot, check_batch, check_sources
from tiercache.tiers.reservations import Reservation, ReservationTable
from tiercache.tiers.shared_breaker import Breaker
from tiercache.tiers.shared_client import SharedStore, StoreRefused, StoreUnavailable
from tiercache.tiers.shared_config import SharedTierConfig
from tiercache.tiers.staging import StagingPool
from tiercache.tiers.values import HEADER_BYTES, copy_out, decode_parts, encode, parse_head

__all__ = ["SharedTier", "SharedTierConfig", "store_key"]

logger = logging.getLogger(__name__)

_STAGING_CACHE_BYTES = 256 << 20
"""Staging buffers kept for reuse after commit or abort."""


def store_key(prefix: str, chunk_id: bytes) -> bytes:
    """The base key of a chunk's record: the prefix's UTF-8 bytes, then ``{<chunk id in hex>}``, a hash
    tag, so that both keys of the record (see :func:`~tiercache.tiers.shared_client.record_keys`) fall in
    one hash slot, and chunks spread over the cluster by their ids."""
    return prefix.encode() + b"{" + bytes(chunk_id).hex().encode() + b"}"


def _check_ids(chunk_ids: Sequence[bytes]) -> None:
    for i, cid in enumerate(chunk_ids):
        if not isinstance(cid, (bytes, bytearray)) or not cid:
            raise InvalidArgumentError(
                "chunk_ids", f"[{i}] must be non-empty bytes, got {type(cid).__name__}"
            )


def _check_dsts(chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> None:
    if len(chunk_ids) != len(dsts):
        raise InvalidArgumentError("dsts", f"{len(dsts)} destinations for {len(chunk_ids)} chunk ids")
    _check_ids(chunk_ids)
    for i, dst in enumerate(dsts):
        if not isinstance(dst, torch.Tensor) or dst.dtype != torch.uint8 or dst.dim() != 1:
            raise InvalidArgumentError("dsts", f"[{i}] must be a 1-D uint8 tensor")


def _deliver(
    head: bytes,
    payload: bytes,
    dst: torch.Tensor,
    dctx: zstandard.ZstdDecompressor,
    dctx_lock: threading.Lock,
) -> int | str:
    """Verify a record and copy its raw bytes into ``dst``; their count, or why the record is malformed.

    A raw payload bound for a contiguous CPU buffer is checksummed block by block where it lands, as it is
    copied (:func:`~tiercache.checksum.copy_checksum`: one pass over the received bytes, not two, and the
    check covers the bytes the caller gets). On a mismatch ``dst`` holds rejected bytes: the caller must not use them. Anything else
    (zstd, another device) is verified before it is copied.

    Raises:
        ValueError: ``dst`` is smaller than the chunk (the caller names the destination).
    """
    header = parse_head(memoryview(head), len(payload))
    if isinstance(header, str):
        return header
    if dst.numel() < header.raw_len:
        raise ValueError(f"holds {dst.numel()} bytes, the chunk has {header.raw_len}")
    if header.codec is Codec.RAW and dst.device.type == "cpu" and dst.is_contiguous():
        out: Any = dst[: header.raw_len].numpy()  # numpy arrays export the buffer protocol
        arrived = copy_checksum(memoryview(out), payload)
        return header.raw_len if arrived == header.checksum else "payload checksum mismatch"
    with dctx_lock:
        raw = decode_parts(memoryview(head), memoryview(payload), dctx)
    if isinstance(raw, str):
        return raw
    copy_out(raw, dst)
    return len(raw)


class SharedTier(StorageTier):
    """The shared tier: a checksummed chunk store in a Redis Cluster or server. See the module docstring."""

    level = TierLevel.SHARED

    def __init__(self, config: SharedTierConfig) -> None:
        """Set the tier up; the store is contacted on first use (a store that is down is not an error).

        Raises:
            InvalidArgumentError: the config is not a ``SharedTierConfig``.
        """
        if not isinstance(config, SharedTierConfig):
            raise InvalidArgumentError("config", f"must be a SharedTierConfig, got {type(config).__name__}")
        self._config = config
        self._store = SharedStore(config)
        self._breaker = Breaker("shared tier", config.backoff_initial_s, config.backoff_max_s)
        self._lock = threading.Lock()
        self._staging = StagingPool(_STAGING_CACHE_BYTES, payload_offset=HEADER_BYTES)
        self._reservations = ReservationTable("SHARED")
        self._view: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._used = self._payload = 0
        self._corrupt_reads = 0
        self._closed = False
        self._dctx = zstandard.ZstdDecompressor()
        self._dctx_lock = threading.Lock()

    @property
    def config(self) -> SharedTierConfig:
        """The tier's configuration."""
        return self._config

    @property
    def available(self) -> bool:
        """Whether the tier is on (not backing off after a failure)."""
        return self._breaker.available()

    @property
    def store_kind(self) -> str:
        """What the seed turned out to be: ``"cluster"``, ``"server"`` or ``"unconnected"``."""
        return self._store.kind

    # ------------------------------------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        """Raise ConflictError if closed; call with ``self._lock`` held."""
        if self._closed:
            raise ConflictError("the shared tier is closed")

    def _key(self, chunk_id: bytes) -> bytes:
        return store_key(self._config.key_prefix, chunk_id)

    def _failed(self, exc: StoreUnavailable | StoreRefused) -> None:
        if isinstance(exc, StoreRefused):
            self._breaker.counted(str(exc))
        else:
            self._breaker.failed(str(exc))

    def _forget(self, chunk_id: bytes) -> None:
        """Drop a chunk from the local view; call with the lock held."""
        entry = self._view.pop(chunk_id, None)
        if entry is not None:
            self._used, self._payload = self._used - entry[0], self._payload - entry[1]

    def _remember(self, chunk_id: bytes, stored: int, nbytes: int) -> None:
        """Record a chunk as in the store, most recently used; call with the lock held."""
        self._forget(chunk_id)
        self._view[chunk_id] = (stored, nbytes)
        self._used, self._payload = self._used + stored, self._payload + nbytes

    # ------------------------------------------------------------------------------------------ protocol

    def charge(self, nbytes: int) -> int:
        """Capacity one chunk of ``nbytes`` payload bytes takes while reserved: header + ``nbytes``."""
        return self._config.charge(nbytes, "nbytes")

    def reserve(self, chunk_ids: Sequence[bytes], sizes: Sequence[int]) -> list[WriteSlot]:
        """Reserve staging buffers (1-D ``uint8`` CPU tensors) for new chunks; all or nothing.

        Raises:
            CapacityError: the tier is bounded and has no room, or the store is unavailable (backing off).
            InvalidArgumentError: bad sizes or ids (see :func:`~tiercache.tiers.base.check_batch`).
            ConflictError: an id is committed (in the local view) or reserved already, or the tier is closed.
        """
        check_batch(chunk_ids, sizes)
        _check_ids(chunk_ids)
        charges = [self._config.charge(size, "sizes") for size in sizes]
        if not chunk_ids:
            return []
        if not self._breaker.available():
            raise CapacityError("the shared tier is unavailable (backing off after a failure)")
        with self._lock:
            self._check_open()
            for cid in chunk_ids:
                if cid in self._view:
                    raise ConflictError(f"chunk {bytes(cid).hex()} is already committed in SHARED")
                if self._reservations.is_reserved(cid):
                    raise ConflictError(f"chunk {bytes(cid).hex()} is already reserved in SHARED")
            if self._config.bounded:
                free = self._config.capacity_bytes - self._used - self._reservations.reserved_bytes
                if sum(charges) > free:
                    raise CapacityError(
                        f"SHARED needs {sum(charges)} bytes for {len(chunk_ids)} chunks, {max(free, 0)} of "
                        f"{self._config.capacity_bytes} are free"
                    )
            slots: list[WriteSlot] = []
            for cid, size, chg in zip(chunk_ids, sizes, charges, strict=True):
                staging = self._staging.take(HEADER_BYTES + size)
                slots.append(self._reservations.add(Reservation(bytes(cid), size, chg, staging)))
            return slots

    def commit(self, slots: Sequence[WriteSlot]) -> None:
        """Write reserved chunks to the store in one pipeline (each chunk one atomic ``HSET``).

        Raises:
            ConflictError: a slot is not a live reservation of this tier, or the tier is closed.
            CapacityError: the store is unavailable or refused the write (nothing is committed here; the
                reservations stay live: abort them). The failure is counted in ``usage().errors``.
        """
        self._commit(slots, None)

    writes_from_sources = True

    def commit_from(
        self,
        slots: Sequence[WriteSlot],
        srcs: Sequence[torch.Tensor],
        checksums: Sequence[int | None] | None = None,
    ) -> None:
        """Like :meth:`commit`, with each chunk's bytes taken from ``srcs`` instead of its slot's buffer:
        a CPU source goes to the socket as it is (no copy at all); another device's is copied through the
        slot's buffer. The source must not change until the call returns. A known ``checksums[i]`` goes
        into the value's header as it is (the source is not hashed again).

        Raises:
            InvalidArgumentError: see :func:`~tiercache.tiers.base.check_sources`.
            ConflictError, CapacityError: as :meth:`commit`.
        """
        check_sources(slots, srcs, checksums)
        raws: list[torch.Tensor] = []
        for slot, src in zip(slots, srcs, strict=True):
            if src.device.type == "cpu" and src.is_contiguous():
                raws.append(src)
            else:
                slot.buffer.copy_(src)
                raws.append(slot.buffer)
        self._commit(slots, raws, checksums)

    def _commit(
        self,
        slots: Sequence[WriteSlot],
        srcs: Sequence[torch.Tensor] | None,
        checksums: Sequence[int | None] | None = None,
    ) -> None:
        """Write the reservations' bytes (their buffers, or ``srcs``) as one pipeline of ``MSET``s."""
        if not slots:
            return
        with self._lock:
            self._check_open()
            tokens, reservations = self._reservations.claim(slots)
        try:
            cctx = None
            if self._config.codec is Codec.ZSTD:
                cctx = zstandard.ZstdCompressor(level=self._config.zstd_level)
            raws = [r.buffer for r in reservations] if srcs is None else srcs
            known = [None] * len(raws) if checksums is None else checksums
            parts = [encode(raw.numpy().data, cctx, c) for raw, c in zip(raws, known, strict=True)]
            if not self._breaker.available():
                raise CapacityError("the shared tier is unavailable (backing off after a failure)")
            records = [(self._key(r.chunk_id), h, p) for r, (h, p) in zip(reservations, parts, strict=True)]
            try:
                self._store.write_many(records)
            except (StoreUnavailable, StoreRefused) as exc:
                self._failed(exc)
                raise CapacityError(f"the shared store did not take {len(records)} chunks: {exc}") from exc
            self._breaker.succeeded()
            with self._lock:
                for token, res, (_, payload) in zip(tokens, reservations, parts, strict=True):
                    self._remember(res.chunk_id, HEADER_BYTES + len(payload), res.nbytes)
                    self._staging.give(self._reservations.finish(token).staging)
        finally:
            with self._lock:
                self._reservations.unclaim(tokens)

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """Discard reservations; unknown, finished or in-commit slots are ignored."""
        with self._lock:
            for res in self._reservations.abort(slots):
                self._staging.give(res.staging)

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """Fetch chunks from the store (one pipeline) into caller buffers, verifying every checksum.

        Returns:
            Per chunk, True if its bytes were copied; False if absent (never stored, or evicted by the
            cluster), corrupt (counted in ``corrupt_reads`` and deleted) or the store is unavailable.

        Raises:
            InvalidArgumentError: lengths differ, an id is not bytes, or a destination is not a 1-D
                ``uint8`` tensor or is smaller than its chunk.
            ConflictError: the tier is closed.
        """
        _check_dsts(chunk_ids, dsts)
        with self._lock:
            self._check_open()
            for i, (cid, dst) in enumerate(zip(chunk_ids, dsts, strict=True)):
                entry = self._view.get(cid)
                if entry is not None and dst.numel() < entry[1]:
                    raise InvalidArgumentError(
                        "dsts", f"[{i}] holds {dst.numel()} bytes, chunk {bytes(cid).hex()} has {entry[1]}"
                    )
        copied = [False] * len(chunk_ids)
        if not chunk_ids or not self._breaker.available():
            return copied
        unique = list(dict.fromkeys(bytes(c) for c in chunk_ids))
        try:
            fetched = dict(zip(unique, self._store.read_many([self._key(c) for c in unique]), strict=True))
        except (StoreUnavailable, StoreRefused) as exc:
            self._failed(exc)
            return copied
        self._breaker.succeeded()
        corrupt: list[bytes] = []
        found: dict[bytes, tuple[int, int]] = {}
        for i, (cid, dst) in enumerate(zip(chunk_ids, dsts, strict=True)):
            record = fetched[bytes(cid)]
            if record is None:
                continue
            head, payload = record
            try:
                got = _deliver(head, payload, dst, self._dctx, self._dctx_lock)
            except ValueError as exc:
                raise InvalidArgumentError("dsts", f"[{i}] chunk {bytes(cid).hex()} {exc}") from None
            if isinstance(got, str):
                logger.warning("SHARED value of chunk %s is malformed (%s): a miss", bytes(cid).hex(), got)
                corrupt.append(bytes(cid))
                fetched[bytes(cid)] = None
                continue
            copied[i] = True
            found[bytes(cid)] = (len(head) + len(payload), got)
        with self._lock:
            for cid in unique:
                if cid in found:
                    self._remember(cid, *found[cid])
                else:
                    self._forget(cid)  # vanished under the cluster's eviction, or corrupt
            self._corrupt_reads += len(corrupt)
        if corrupt:
            self._delete_quietly(corrupt)
        return copied

    def _delete_quietly(self, chunk_ids: list[bytes]) -> None:
        """Delete corrupt values; a failure is counted, not raised (the value stays a miss either way)."""
        try:
            self._store.delete_many([self._key(c) for c in chunk_ids])
        except (StoreUnavailable, StoreRefused) as exc:
            self._failed(exc)

    def contains(self, chunk_ids: Sequence[bytes]) -> list[bool]:
        """Per id, whether the store holds the chunk (all False while the store is unavailable).

        Raises:
            InvalidArgumentError: an id is not bytes.
            ConflictError: the tier is closed.
        """
        _check_ids(chunk_ids)
        with self._lock:
            self._check_open()
        if not chunk_ids or not self._breaker.available():
            return [False] * len(chunk_ids)
        try:
            present = self._store.exists_many([self._key(c) for c in chunk_ids])
        except (StoreUnavailable, StoreRefused) as exc:
            self._failed(exc)
            return [False] * len(chunk_ids)
        self._breaker.succeeded()
        return present

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """Delete chunks from the store (and the local view); absent ids are ignored.

        Returns:
            How many the store held. While the store is unavailable the chunks are only forgotten locally
            (the cluster's eviction takes them in time) and 0 is returned.

        Raises:
            InvalidArgumentError: an id is not bytes.
            ConflictError: the tier is closed.
        """
        _check_ids(chunk_ids)
        unique = list(dict.fromkeys(bytes(c) for c in chunk_ids))
        with self._lock:
            self._check_open()
            for cid in unique:
                self._forget(cid)
        if not unique or not self._breaker.available():
            return 0
        try:
            removed = self._store.delete_many([self._key(c) for c in unique])
        except (StoreUnavailable, StoreRefused) as exc:
            self._failed(exc)
            return 0
        self._breaker.succeeded()
        return removed

    def entries(self) -> list[tuple[bytes, int]]:
        """The chunks this daemon wrote or read, as ``(chunk_id, nbytes)``, least recently used first.

        Raises:
            ConflictError: the tier is closed.
        """
        with self._lock:
            self._check_open()
            return [(cid, nbytes) for cid, (_, nbytes) in self._view.items()]

    def usage(self) -> TierUsage:
        """The local view's space (stored headers + payloads) and the tier's counters."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._view),
                used_bytes=self._used,
                reserved_bytes=self._reservations.reserved_bytes,
                capacity_bytes=self._config.effective_capacity_bytes,
                corrupt_reads=self._corrupt_reads,
                errors=self._breaker.errors,
                payload_bytes=self._payload,
            )

    def close(self) -> None:
        """Close the connections (idempotent). The chunks stay in the store for every other daemon."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._reservations.clear()
        self._store.close()
        logger.info("closed the shared tier")

    def __repr__(self) -> str:
        return f"SharedTier(seeds={len(self._config.seeds)}, capacity_bytes={self._config.capacity_bytes})"

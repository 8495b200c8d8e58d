"""The L3 tier: chunks in an LMDB environment on SSD, checksummed and optionally zstd-compressed.

One LMDB environment (a directory) holds two sub-databases: ``values`` (chunk id -> header + payload) and
``order`` (chunk id -> access sequence number, 8 bytes big-endian). Committed chunks survive a restart of
the process: opening the environment again rebuilds the index and the access order from both databases.

A stored value is a fixed :data:`HEADER_BYTES`-long header followed by the payload. The header is
``struct`` ``<4sBBHQQQQ``, little-endian:

====== ====== ==========================================================================
offset bytes  field
====== ====== ==========================================================================
0      4      magic ``b"TCL3"``
4      1      format version (:data:`FORMAT_VERSION`)
5      1      codec (0 raw, 1 zstd)
6      2      flags (0; any other value is malformed)
8      8      raw length: payload bytes once decoded (the chunk's ``nbytes``)
16     8      stored length: payload bytes that follow the header
24     8      xxh3_64 of the raw (decoded) bytes
32     8      xxh3_64 of header bytes 0..31 (header checksum)
====== ====== ==========================================================================

Every read verifies the header checksum, the stored length against the value's real length (a truncated
value fails) and the raw checksum. A value that fails any check is a miss, is counted in
``corrupt_reads`` and is deleted. Opening the environment checks every header (not the payloads) and drops
malformed or truncated values in the same way.

Durability: with ``durable=False`` the environment is opened with ``sync=False`` (no fsync per commit).
A process crash loses nothing: committed data is in the OS page cache. An OS crash or power loss may lose
the last commits; LMDB's documentation warns that without sync it can even damage the database. A torn or
damaged value is never served: the checksums turn it into a miss. With ``durable=True`` every commit is
fsynced before it returns.

Primitives:
    LmdbTierConfig: path, capacity, codec, zstd level, durability and map size of one L3 tier.
    LmdbTier: the :class:`~tiercache.tiers.base.StorageTier` over LMDB, with ``flush()`` to persist access order.
    HEADER_BYTES, FORMAT_VERSION, MAGIC: the on-disk value format.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import lmdb
import numpy as np
import torch
import xxhash
import zstandard

from tiercache.codec import Codec
from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.tiers.base import StorageTier, TierLevel, TierUsage, WriteSlot, check_batch

logger = logging.getLogger(__name__)

MAGIC = b"TCL3"
"""First four bytes of every stored value."""
FORMAT_VERSION = 1
"""Version of the value format written by this module."""
_HEADER = struct.Struct("<4sBBHQQQ")
_HEADER_CHECK = struct.Struct("<Q")
HEADER_BYTES = _HEADER.size + _HEADER_CHECK.size
"""Bytes of the header that precedes every payload (40)."""
_SEQ = struct.Struct(">Q")

MIN_ZSTD_LEVEL = -(1 << 17)
"""Lowest (fastest) zstd level, ``ZSTD_minCLevel()``."""
MAX_ZSTD_LEVEL = zstandard.MAX_COMPRESSION_LEVEL
"""Highest zstd level."""
_MAX_VALUE_BYTES = 0xFFFFFFFF
"""LMDB's largest value (``MDB_MAXDATASIZE``)."""
ORDER_FLUSH_READS = 256
"""Successful chunk reads after which the access order is written to the ``order`` database."""
_VALUES_DB = b"values"
_ORDER_DB = b"order"
_MIN_EXTRA_MAP_BYTES = 1 << 30
_STAGING_CACHE_BYTES = 256 << 20
_DAMAGE = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError, lmdb.VersionMismatchError)
"""LMDB errors that mean the environment's files are damaged (e.g. by an OS crash without ``durable``)."""
"""Staging buffers kept for reuse after commit or abort."""


_CODEC_WIRE = {Codec.RAW: 0, Codec.ZSTD: 1}
_WIRE_CODEC = {v: k for k, v in _CODEC_WIRE.items()}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class LmdbTierConfig:
    """Configuration of one L3 tier.

    Attributes:
        path: directory of the LMDB environment (created if missing).
        capacity_bytes: bound on the stored bytes (headers + payloads) plus outstanding reservations.
        codec: how payloads are stored; a zstd payload that is not smaller than the raw bytes is stored raw.
        zstd_level: zstd compression level, ``MIN_ZSTD_LEVEL..MAX_ZSTD_LEVEL`` (used with ``Codec.ZSTD``).
        durable: fsync every commit (``sync=True``); otherwise an OS crash may lose the last commits (see the
            module docstring).
        map_size_bytes: LMDB map size; None for ``max(4 * capacity_bytes, capacity_bytes + 1 GiB)``.
        recover_damaged: when the environment's files are damaged, move them aside
            (``<path>.damaged-<time>``) and start empty instead of failing: it is a cache.
        fault_read_delay_s: fault injection, off by default: extra latency added to every read call.
        fault_read_bytes_per_s: fault injection, off (0) by default: reads are throttled to this rate.
    """

    path: str
    capacity_bytes: int
    codec: Codec = Codec.RAW
    zstd_level: int = 3
    durable: bool = False
    map_size_bytes: int | None = None
    recover_damaged: bool = True
    fault_read_delay_s: float = 0.0
    fault_read_bytes_per_s: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.fault_read_delay_s, bool) or not self.fault_read_delay_s >= 0:
            raise InvalidArgumentError("fault_read_delay_s", f"must be >= 0, got {self.fault_read_delay_s!r}")
        if not _is_int(self.fault_read_bytes_per_s) or self.fault_read_bytes_per_s < 0:
            raise InvalidArgumentError(
                "fault_read_bytes_per_s",
                f"must be a non-negative integer, got {self.fault_read_bytes_per_s!r}",
            )
        if not isinstance(self.path, str) or not self.path:
            raise InvalidArgumentError("path", f"must be a non-empty string, got {self.path!r}")
        if not _is_int(self.capacity_bytes) or self.capacity_bytes <= 0:
            raise InvalidArgumentError(
                "capacity_bytes", f"must be a positive integer, got {self.capacity_bytes!r}"
            )
        if not isinstance(self.codec, Codec):
            valid = ", ".join(c.name for c in Codec)
            raise InvalidArgumentError("codec", f"must be a Codec ({valid}), got {self.codec!r}")
        if not _is_int(self.zstd_level) or not MIN_ZSTD_LEVEL <= self.zstd_level <= MAX_ZSTD_LEVEL:
            raise InvalidArgumentError(
                "zstd_level",
                f"must be an integer in [{MIN_ZSTD_LEVEL}, {MAX_ZSTD_LEVEL}], got {self.zstd_level!r}",
            )
        if not isinstance(self.durable, bool):
            raise InvalidArgumentError("durable", f"must be a bool, got {self.durable!r}")
        if self.map_size_bytes is not None and (not _is_int(self.map_size_bytes) or self.map_size_bytes <= 0):
            raise InvalidArgumentError(
                "map_size_bytes", f"must be a positive integer or None, got {self.map_size_bytes!r}"
            )

    @property
    def effective_map_size_bytes(self) -> int:
        """The LMDB map size the tier opens with.

        Pages freed by a transaction are reusable only once no snapshot needs them, and a large value
        needs a contiguous run of pages, so the map is sized well above the capacity. It costs address
        space only: the data file is sparse (its apparent size is the map size, its disk use is what is
        written).
        """
        if self.map_size_bytes is not None:
            return self.map_size_bytes
        return max(4 * self.capacity_bytes, self.capacity_bytes + _MIN_EXTRA_MAP_BYTES)


@dataclass(slots=True)
class _Reservation:
    chunk_id: bytes
    nbytes: int
    charge: int
    staging: torch.Tensor  # HEADER_BYTES of room for the header, then the payload

    @property
    def buffer(self) -> torch.Tensor:
        return self.staging[HEADER_BYTES:]


class _StagingPool:
    """Reuses staging buffers: a fresh large allocation is page-faulted on first touch at ~1 GB/s."""

    def __init__(self, budget_bytes: int) -> None:
        self._budget = budget_bytes
        self._held = 0
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            bucket = self._free.get(nbytes)
            if bucket:
                self._held -= nbytes
                return bucket.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffer: torch.Tensor) -> None:
        nbytes = buffer.numel()
        with self._lock:
            if self._held + nbytes <= self._budget:
                self._free.setdefault(nbytes, []).append(buffer)
                self._held += nbytes


def _pack_header(codec: Codec, raw_len: int, stored_len: int, checksum: int) -> bytes:
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, _CODEC_WIRE[codec], 0, raw_len, stored_len, checksum)
    return head + _HEADER_CHECK.pack(xxhash.xxh3_64_intdigest(head))


@dataclass(frozen=True, slots=True)
class _Header:
    codec: Codec
    raw_len: int
    stored_len: int
    checksum: int


def _parse_header(value: memoryview) -> _Header | str:
    """The header of a stored value, or why it is malformed (also checks the value's length)."""
    if len(value) < HEADER_BYTES:
        return f"value of {len(value)} bytes is shorter than the header"
    (check,) = _HEADER_CHECK.unpack_from(value, _HEADER.size)
    if xxhash.xxh3_64_intdigest(value[: _HEADER.size]) != check:
        return "header checksum mismatch"
    magic, version, codec_id, flags, raw_len, stored_len, checksum = _HEADER.unpack_from(value, 0)
    if magic != MAGIC:
        return f"bad magic {magic!r}"
    if version != FORMAT_VERSION:
        return f"unsupported format version {version}"
    codec = _WIRE_CODEC.get(codec_id)
    if codec is None:
        return f"unknown codec {codec_id}"
    if flags != 0:
        return f"unknown flags {flags:#x}"
    if raw_len <= 0:
        return f"raw length {raw_len} is not positive"
    if stored_len != len(value) - HEADER_BYTES:
        return f"truncated: header says {stored_len} payload bytes, value holds {len(value) - HEADER_BYTES}"
    if codec is Codec.RAW and stored_len != raw_len:
        return f"raw payload of {stored_len} bytes for a raw length of {raw_len}"
    return _Header(codec, raw_len, stored_len, checksum)


def _decode(value: memoryview, dctx: zstandard.ZstdDecompressor) -> memoryview | bytes | str:
    """The verified raw bytes of a stored value (a view of ``value`` for raw payloads), or what is wrong."""
    header = _parse_header(value)
    if isinstance(header, str):
        return header
    payload = value[HEADER_BYTES:]
    raw: memoryview | bytes
    if header.codec is Codec.RAW:
        raw = payload
    else:
        try:
            size = zstandard.frame_content_size(payload)
            if size != header.raw_len:
                return f"zstd frame declares {size} bytes, header {header.raw_len}"
            raw = dctx.decompress(payload, max_output_size=header.raw_len)
        except zstandard.ZstdError as exc:
            return f"zstd: {exc}"
        if len(raw) != header.raw_len:
            return f"decompressed {len(raw)} bytes, header says {header.raw_len}"
    if xxhash.xxh3_64_intdigest(raw) != header.checksum:
        return "payload checksum mismatch"
    return raw


def _check_ids(chunk_ids: Sequence[bytes], field: str = "chunk_ids") -> None:
    for i, cid in enumerate(chunk_ids):
        if not isinstance(cid, bytes):
            raise InvalidArgumentError(field, f"[{i}] must be bytes, got {type(cid).__name__}")


class LmdbTier(StorageTier):
    """The L3 tier: a capacity-bounded, checksummed chunk store in one LMDB environment.

    Space accounting: a committed chunk occupies its stored value (header + payload, possibly compressed);
    a reservation occupies :meth:`charge` (header + raw size, the worst case) until it is committed or
    aborted. The tier never evicts: the cache manager picks victims from :meth:`entries` and deletes them.

    Thread-safety: every method may be called from any thread. One lock guards the in-memory index, a
    second serializes LMDB write transactions (which LMDB serializes anyway) so that access-order writes
    land in order. :meth:`close` waits for reads in progress and must not race other calls otherwise.
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
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._index: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._pending_order: dict[bytes, int] = {}
        self._reads_since_flush = 0
        self._seq = 0
        self._used = 0
        self._reserved = 0
        self._corrupt_reads = 0
        self._reservations: dict[int, _Reservation] = {}
        self._staging = _StagingPool(_STAGING_CACHE_BYTES)
        self._reserved_ids: set[bytes] = set()
        self._committing: set[int] = set()
        self._tokens = itertools.count(1)
        self._active_reads = 0
        self._closed = False
        try:
            self._open()
        except _DAMAGE as exc:
            if not config.recover_damaged:
                raise InvalidArgumentError(
                    "path", f"LMDB environment at {config.path!r} is damaged: {exc}"
                ) from exc
            aside = f"{config.path.rstrip(os.sep)}.damaged-{int(time.time())}"
            logger.error(
                "L3 at %s is damaged (%s): moved aside to %s, starting empty", config.path, exc, aside
            )
            os.rename(config.path, aside)
            self._reset_index()
            self._open()
        if self._used > self._capacity:
            logger.warning(
                "L3 at %s holds %d bytes, over its capacity of %d bytes",
                config.path,
                self._used,
                self._capacity,
            )
        logger.info(
            "opened L3 tier at %s: %d chunks, %d bytes (capacity %d, codec %s)",
            config.path,
            len(self._index),
            self._used,
            self._capacity,
            config.codec.value,
        )

    @property
    def config(self) -> LmdbTierConfig:
        """The tier's configuration."""
        return self._config

    # ----------------------------------------------------------------------------------------------- open

    def _load(self) -> None:
        """Rebuild the index, the access order and the usage from both databases; drop malformed values."""
        found: dict[bytes, tuple[int, int]] = {}
        bad: list[bytes] = []
        seqs: dict[bytes, int] = {}
        stale_order: list[bytes] = []
        with self._env.begin(buffers=True) as txn:
            for key, value in txn.cursor(db=self._values):
                cid = bytes(key)
                header = _parse_header(value)
                if isinstance(header, str):
                    logger.warning("L3 value %s is malformed (%s); dropping it", cid.hex(), header)
                    bad.append(cid)
                else:
                    found[cid] = (len(value), header.raw_len)
            for key, value in txn.cursor(db=self._order):
                cid = bytes(key)
                if cid in found and len(value) == _SEQ.size:
                    (seqs[cid],) = _SEQ.unpack(value)
                else:
                    stale_order.append(cid)
        # Chunks without a recorded sequence number go first (key order among them).
        ordered = sorted(found, key=lambda c: (c in seqs, seqs.get(c, 0), c))
        for cid in ordered:
            self._index[cid] = found[cid]
            self._used += found[cid][0]
        self._seq = max(seqs.values(), default=0)
        self._corrupt_reads = len(bad)
        if bad or stale_order:
            try:
                with self._env.begin(write=True) as txn:
                    for cid in bad:
                        txn.delete(cid, db=self._values)
                        txn.delete(cid, db=self._order)
                    for cid in stale_order:
                        txn.delete(cid, db=self._order)
            except lmdb.MapFullError:
                logger.exception("L3 at %s: map full while dropping malformed values", self._config.path)

    # ------------------------------------------------------------------------------------------- helpers

    def _open(self) -> None:
        """Open (or create) the environment, rebuild the index from it, reserve its disk blocks."""
        config = self._config
        try:
            self._env = lmdb.open(
                config.path,
                map_size=config.effective_map_size_bytes,
                subdir=True,
                max_dbs=2,
                sync=config.durable,
                metasync=config.durable,
                readahead=False,
                meminit=False,
                writemap=True,
                lock=True,
                create=True,
            )
        except _DAMAGE:
            raise
        except lmdb.Error as exc:
            raise InvalidArgumentError(
                "path", f"cannot open LMDB environment at {config.path!r}: {exc}"
            ) from exc
        try:
            self._max_key: int = self._env.max_key_size()
            self._values = self._env.open_db(_VALUES_DB)
            self._order = self._env.open_db(_ORDER_DB)
            self._load()
            self._preallocate()
        except _DAMAGE:
            self._env.close()
            raise
        except lmdb.Error as exc:
            self._env.close()
            raise InvalidArgumentError(
                "path", f"cannot load the LMDB environment at {config.path!r}: {exc}"
            ) from exc
        except BaseException:
            self._env.close()
            raise

    def _reset_index(self) -> None:
        """Forget what a damaged environment's partial load put in the index."""
        self._index.clear()
        self._pending_order.clear()
        self._seq = self._used = self._corrupt_reads = 0

    def _preallocate(self) -> None:
        """Allocate disk blocks for the capacity up front.

        Writes go through a shared writable map (``writemap``, which halves the copies of a store): on a
        sparse file a full disk would surface as SIGBUS in the middle of a store. Reserving the blocks at
        start turns a disk too small for the configured capacity into a clear error now.

        Raises:
            InvalidArgumentError: the filesystem cannot hold ``capacity_bytes`` (field ``capacity_bytes``).
        """
        want = min(self._config.effective_map_size_bytes, self._capacity + self._capacity // 4)
        data = os.path.join(self._config.path, "data.mdb")
        fd = os.open(data, os.O_RDWR)
        try:
            if os.fstat(fd).st_blocks * 512 >= want:
                return
            os.posix_fallocate(fd, 0, want)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise InvalidArgumentError(
                    "capacity_bytes",
                    f"the filesystem of {self._config.path!r} cannot hold {want} bytes for L3: {exc}",
                ) from None
            logger.info("L3 at %s: no preallocation (%s); stores may run slower", self._config.path, exc)
        finally:
            os.close(fd)

    def _check_open(self) -> None:
        """Raise ConflictError if closed; call with ``self._lock`` held."""
        if self._closed:
            raise ConflictError(f"L3 tier at {self._config.path} is closed")

    def _take_pending(self) -> dict[bytes, int]:
        """Detach the pending access-order updates; call with ``self._lock`` held."""
        pending, self._pending_order = self._pending_order, {}
        self._reads_since_flush = 0
        return pending

    def _restore_pending(self, pending: dict[bytes, int]) -> None:
        """Put back updates that failed to land; newer ones win; call with ``self._lock`` held."""
        for cid, seq in pending.items():
            if cid in self._index and cid not in self._pending_order:
                self._pending_order[cid] = seq

    def _flush_locked(self) -> None:
        """Write pending access-order updates; call with ``self._write_lock`` held and the env open."""
        with self._lock:
            pending = self._take_pending()
        if not pending:
            return
        try:
            with self._env.begin(write=True, db=self._order) as txn:
                for cid, seq in pending.items():
                    txn.put(cid, _SEQ.pack(seq))
        except BaseException:
            with self._lock:
                self._restore_pending(pending)
            raise

    def _touch(self, chunk_ids: Sequence[bytes]) -> bool:
        """Mark chunks as just used; returns whether the access order is due for a flush."""
        with self._lock:
            for cid in chunk_ids:
                if cid in self._index:
                    self._seq += 1
                    self._index.move_to_end(cid)
                    self._pending_order[cid] = self._seq
                    self._reads_since_flush += 1
            return self._reads_since_flush >= ORDER_FLUSH_READS

    @staticmethod
    def _encode(res: _Reservation, cctx: zstandard.ZstdCompressor | None) -> memoryview | bytes:
        """Header + payload of one chunk (compressed if that makes it smaller).

        A raw value is the staging buffer itself with the header written in front: no extra copy.
        """
        raw = res.buffer.numpy().data
        checksum = xxhash.xxh3_64_intdigest(raw)
        if cctx is not None:
            compressed = cctx.compress(raw)
            if len(compressed) < len(raw):
                header = _pack_header(Codec.ZSTD, len(raw), len(compressed), checksum)
                return b"".join((header, compressed))
        header = _pack_header(Codec.RAW, len(raw), len(raw), checksum)
        staging = res.staging.numpy()
        staging[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
        return staging.data

    # ------------------------------------------------------------------------------------------ protocol

    def charge(self, nbytes: int) -> int:
        """Capacity one chunk of ``nbytes`` payload bytes takes while reserved: header + ``nbytes``.

        A committed chunk takes its stored size, which is never more (zstd is kept only when smaller).

        Raises:
            InvalidArgumentError: ``nbytes`` is not a positive integer or can never fit in this tier.
        """
        return self._charge(nbytes, "nbytes")

    def _charge(self, nbytes: int, field: str) -> int:
        if not _is_int(nbytes) or nbytes <= 0:
            raise InvalidArgumentError(field, f"must be a positive integer, got {nbytes!r}")
        total = HEADER_BYTES + nbytes
        if total > self._capacity:
            raise InvalidArgumentError(
                field,
                f"{nbytes} bytes (+{HEADER_BYTES} header) exceed the capacity of {self._capacity} bytes",
            )
        if total > _MAX_VALUE_BYTES:
            raise InvalidArgumentError(field, f"{nbytes} bytes exceed LMDB's largest value")
        return total

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
        _check_ids(chunk_ids)
        for i, cid in enumerate(chunk_ids):
            if not 0 < len(cid) <= self._max_key:
                raise InvalidArgumentError(
                    "chunk_ids", f"[{i}] must be 1..{self._max_key} bytes (LMDB's key limit), got {len(cid)}"
                )
        charges = [self._charge(size, "sizes") for size in sizes]
        total = sum(charges)
        if not chunk_ids:
            return []
        with self._lock:
            self._check_open()
            for cid in chunk_ids:
                if cid in self._index:
                    raise ConflictError(f"chunk {cid.hex()} is already committed in L3")
                if cid in self._reserved_ids:
                    raise ConflictError(f"chunk {cid.hex()} is already reserved in L3")
            free = self._capacity - self._used - self._reserved
            if total > free:
                raise CapacityError(
                    f"L3 needs {total} bytes for {len(chunk_ids)} chunks, {max(free, 0)} of "
                    f"{self._capacity} are free"
                )
            slots: list[WriteSlot] = []
            for cid, size, chg in zip(chunk_ids, sizes, charges, strict=True):
                token = next(self._tokens)
                res = _Reservation(cid, size, chg, self._staging.take(HEADER_BYTES + size))
                self._reservations[token] = res
                self._reserved_ids.add(cid)
                slots.append(WriteSlot(chunk_id=cid, nbytes=size, buffer=res.buffer, token=token))
            self._reserved += total
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
        if not slots:
            return
        with self._lock:
            self._check_open()
            tokens: list[int] = []
            for slot in slots:
                res = self._reservations.get(slot.token)
                if (
                    res is None
                    or res.chunk_id != slot.chunk_id
                    or res.nbytes != slot.nbytes
                    or slot.token in self._committing
                    or slot.token in tokens
                ):
                    raise ConflictError(
                        f"slot {slot.token} for chunk {slot.chunk_id.hex()} is not a live L3 reservation"
                    )
                tokens.append(slot.token)
            reservations = [self._reservations[t] for t in tokens]
            self._committing.update(tokens)
        try:
            self._commit(tokens, reservations)
        finally:
            with self._lock:
                self._committing.difference_update(tokens)

    def _commit(self, tokens: list[int], reservations: list[_Reservation]) -> None:
        cctx = None
        if self._config.codec is Codec.ZSTD:
            cctx = zstandard.ZstdCompressor(level=self._config.zstd_level)
        values = [self._encode(res, cctx) for res in reservations]
        with self._write_lock:
            with self._lock:
                self._check_open()
                first = self._seq + 1
                self._seq += len(values)
                pending = self._take_pending()
            try:
                with self._env.begin(write=True) as txn:
                    for cid, seq in pending.items():
                        txn.put(cid, _SEQ.pack(seq), db=self._order)
                    for i, (res, value) in enumerate(zip(reservations, values, strict=True)):
                        txn.put(res.chunk_id, value, db=self._values)
                        txn.put(res.chunk_id, _SEQ.pack(first + i), db=self._order)
            except lmdb.MapFullError as exc:
                with self._lock:
                    self._restore_pending(pending)
                stored = sum(len(v) for v in values)
                raise CapacityError(
                    f"L3 LMDB map ({self._config.effective_map_size_bytes} bytes) is full; "
                    f"{len(values)} chunks ({stored} bytes) were not committed"
                ) from exc
            except BaseException:
                with self._lock:
                    self._restore_pending(pending)
                raise
            with self._lock:
                moved = self._seq != first + len(values) - 1
                for token, res, value in zip(tokens, reservations, values, strict=True):
                    self._index[res.chunk_id] = (len(value), res.nbytes)
                    self._index.move_to_end(res.chunk_id)
                    if moved:  # reads touched other chunks meanwhile: this commit is now the latest use
                        self._seq += 1
                        self._pending_order[res.chunk_id] = self._seq
                    self._used += len(value)
                    self._reserved -= res.charge
                    self._reserved_ids.discard(res.chunk_id)
                    del self._reservations[token]
                    self._staging.give(res.staging)

    def abort(self, slots: Sequence[WriteSlot]) -> None:
        """Discard reservations; unknown, finished or in-commit slots are ignored."""
        with self._lock:
            for slot in slots:
                res = self._reservations.get(slot.token)
                if res is None or res.chunk_id != slot.chunk_id or slot.token in self._committing:
                    continue
                del self._reservations[slot.token]
                self._reserved_ids.discard(res.chunk_id)
                self._reserved -= res.charge
                self._staging.give(res.staging)

    def read_into(self, chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> list[bool]:
        """Copy committed chunks into caller buffers, verifying every checksum.

        Raw payloads are checksummed and copied straight out of LMDB's memory map; zstd payloads are
        decompressed, then checksummed, then copied. A CUDA (or other non-CPU) destination is staged
        through a CPU tensor. A successful read makes the chunk the most recently used.

        Args:
            chunk_ids: chunks to read (duplicates allowed).
            dsts: 1-D ``uint8`` tensors, each at least as long as its chunk (any device).

        Returns:
            Per chunk, True if its bytes were copied; False if absent or corrupt (a corrupt value is
            counted in ``corrupt_reads`` and deleted).

        Raises:
            InvalidArgumentError: lengths differ, an id is not bytes, or a destination is not a strided
                1-D ``uint8`` tensor or is smaller than its chunk.
            ConflictError: the tier is closed.
        """
        if len(chunk_ids) != len(dsts):
            raise InvalidArgumentError(
                "dsts", f"got {len(dsts)} destinations for {len(chunk_ids)} chunk ids; they must match"
            )
        _check_ids(chunk_ids)
        for i, dst in enumerate(dsts):
            if not isinstance(dst, torch.Tensor):
                raise InvalidArgumentError("dsts", f"[{i}] must be a torch.Tensor, got {type(dst).__name__}")
            if dst.dtype != torch.uint8 or dst.dim() != 1 or dst.layout != torch.strided:
                raise InvalidArgumentError(
                    "dsts",
                    f"[{i}] must be a strided 1-D uint8 tensor, got {dst.dtype} with shape "
                    f"{tuple(dst.shape)} ({dst.layout})",
                )
        with self._lock:
            self._check_open()
            sizes = [self._index.get(cid) for cid in chunk_ids]
            for i, (entry, dst) in enumerate(zip(sizes, dsts, strict=True)):
                if entry is not None and dst.numel() < entry[1]:
                    raise InvalidArgumentError(
                        "dsts", f"[{i}] holds {dst.numel()} bytes, chunk {chunk_ids[i].hex()} has {entry[1]}"
                    )
            self._active_reads += 1
        results = [False] * len(chunk_ids)
        corrupt: list[bytes] = []
        try:
            if any(entry is not None for entry in sizes):
                self._read(chunk_ids, dsts, sizes, results, corrupt)
        finally:
            with self._lock:
                self._active_reads -= 1
                if self._active_reads == 0:
                    self._idle.notify_all()
        if corrupt:
            self._drop_corrupt(corrupt)
        self._inject_read_faults(sizes)
        hits = [cid for cid, ok in zip(chunk_ids, results, strict=True) if ok]
        if hits and self._touch(hits):
            self._flush_quietly()
        return results

    def _read(
        self,
        chunk_ids: Sequence[bytes],
        dsts: Sequence[torch.Tensor],
        sizes: list[tuple[int, int] | None],
        results: list[bool],
        corrupt: list[bytes],
    ) -> None:
        dctx = zstandard.ZstdDecompressor()
        with self._env.begin(db=self._values, buffers=True) as txn:
            for i, (cid, dst) in enumerate(zip(chunk_ids, dsts, strict=True)):
                if sizes[i] is None:
                    continue
                value = txn.get(cid)
                if value is None:  # deleted since the index was consulted
                    continue
                raw = _decode(value, dctx)
                if isinstance(raw, str):
                    logger.warning("L3 chunk %s is corrupt (%s); dropping it", cid.hex(), raw)
                    corrupt.append(cid)
                    continue
                n = len(raw)
                if n > dst.numel():  # replaced by a larger chunk since the index was consulted
                    continue
                src = np.frombuffer(raw, dtype=np.uint8)
                if dst.device.type == "cpu":
                    np.copyto(dst[:n].numpy(), src)
                else:
                    staging = torch.empty(n, dtype=torch.uint8)
                    np.copyto(staging.numpy(), src)
                    dst[:n].copy_(staging)
                results[i] = True

    def _inject_read_faults(self, sizes: list[tuple[int, int] | None]) -> None:
        """Slow reads down as configured (fault injection for deadline tests; off by default)."""
        delay = self._config.fault_read_delay_s
        rate = self._config.fault_read_bytes_per_s
        if rate:
            delay += sum(entry[0] for entry in sizes if entry is not None) / rate
        if delay > 0:
            time.sleep(delay)

    def _drop_corrupt(self, chunk_ids: list[bytes]) -> None:
        """Count corrupt reads and delete those values if they are still corrupt (not replaced)."""
        with self._lock:
            self._corrupt_reads += len(set(chunk_ids))
        removed: list[bytes] = []
        with self._write_lock:
            with self._lock:
                if self._closed:
                    return
            dctx = zstandard.ZstdDecompressor()
            try:
                with self._env.begin(write=True, buffers=True) as txn:
                    for cid in dict.fromkeys(chunk_ids):
                        value = txn.get(cid, db=self._values)
                        if value is not None and not isinstance(_decode(value, dctx), str):
                            continue  # replaced by a good value meanwhile
                        txn.delete(cid, db=self._values)
                        txn.delete(cid, db=self._order)
                        removed.append(cid)
            except lmdb.MapFullError:
                logger.exception("L3 at %s: map full while deleting corrupt values", self._config.path)
                return
            with self._lock:
                for cid in removed:
                    entry = self._index.pop(cid, None)
                    if entry is not None:
                        self._used -= entry[0]
                    self._pending_order.pop(cid, None)

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
        _check_ids(chunk_ids)
        with self._lock:
            self._check_open()
            return [cid in self._index for cid in chunk_ids]

    def delete(self, chunk_ids: Sequence[bytes]) -> int:
        """Remove committed chunks in one write transaction; absent ids are ignored.

        Returns:
            How many chunks were removed.

        Raises:
            InvalidArgumentError: an id is not bytes.
            ConflictError: the tier is closed.
            CapacityError: the LMDB map is so full that even a delete cannot run (nothing is removed;
                only possible with an explicit, too small ``map_size_bytes``).
        """
        _check_ids(chunk_ids)
        with self._write_lock:
            with self._lock:
                self._check_open()
                present = [cid for cid in dict.fromkeys(chunk_ids) if cid in self._index]
            if not present:
                return 0
            try:
                with self._env.begin(write=True) as txn:
                    for cid in present:
                        txn.delete(cid, db=self._values)
                        txn.delete(cid, db=self._order)
            except lmdb.MapFullError as exc:
                raise CapacityError(f"L3 LMDB map is full; could not delete {len(present)} chunks") from exc
            with self._lock:
                for cid in present:
                    stored, _ = self._index.pop(cid)
                    self._used -= stored
                    self._pending_order.pop(cid, None)
        return len(present)

    def entries(self) -> list[tuple[bytes, int]]:
        """Committed chunks as ``(chunk_id, nbytes)``, least recently committed or read first.

        Raises:
            ConflictError: the tier is closed.
        """
        with self._lock:
            self._check_open()
            return [(cid, nbytes) for cid, (_, nbytes) in self._index.items()]

    def usage(self) -> TierUsage:
        """A snapshot of space and counters (``used_bytes`` counts stored headers + payloads)."""
        with self._lock:
            return TierUsage(
                level=self.level,
                chunks=len(self._index),
                used_bytes=self._used,
                reserved_bytes=self._reserved,
                capacity_bytes=self._capacity,
                corrupt_reads=self._corrupt_reads,
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
                self._reserved_ids.clear()
                self._reserved = 0
        logger.info("closed L3 tier at %s", self._config.path)

    def __repr__(self) -> str:
        return f"LmdbTier(path={self._config.path!r}, capacity_bytes={self._capacity})"

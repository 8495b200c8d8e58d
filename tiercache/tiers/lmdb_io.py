"""The L3 tier's LMDB transactions: the bytes that move in and out, and nothing of the bookkeeping.

The tier decides what to read, write or delete and keeps the books (index, usage, access order,
reservations, corrupt counts) under its locks; this module checks the caller's buffers and runs one LMDB
transaction per call. A value whose per-chunk record (:mod:`tiercache.tiers.lmdb_meta`) names another
checksum is corrupt (a value of another key). Reads: a raw payload is copied straight out of the memory map
into its destination and the checksum is taken over the bytes that arrived, block by block as they land
(hot in the CPU's cache: one pass over the mapped bytes, not two); a zstd payload is decompressed,
checksummed, then copied; a non-CPU destination is staged through a CPU tensor. A value that fails is
reported, its destination's bytes are not. Each header is parsed once per read. Writes land with their
access sequence numbers in the same transaction.

Primitives:
    DiskFullError: a commit found the disk full (both the ``lmdb.DiskError`` it is and a CapacityError).
    StoredValue: one value to write (id, value, chain depth if known).
    check_ids: every chunk id is ``bytes``.
    check_dsts: destinations are strided 1-D ``uint8`` tensors, one per id.
    ReadOutcome: per chunk whether it was copied, and which values were corrupt.
    read_values: decode, verify and copy the values of a batch in one read transaction.
    write_values: store values, their sequence numbers and records (and pending order updates) in one
        transaction.
    write_order: store pending access-order updates.
    delete_values: delete chunks (values, order and meta records) in one transaction.
    delete_corrupt: delete the chunks whose stored value is (still) corrupt; returns them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import lmdb
import numpy as np
import torch
import zstandard

from tiercache.checksum import copy_checksum_array
from tiercache.errors import CapacityError, InvalidArgumentError
from tiercache.tiers.lmdb_env import LmdbDatabases
from tiercache.tiers.lmdb_meta import foreign, record_checksum, record_of
from tiercache.tiers.lmdb_order import pack_seq
from tiercache.tiers.values import HEADER_BYTES, checksum, copy_out, decode, parse_header, raw_checksum

logger = logging.getLogger(__name__)


class DiskFullError(CapacityError, lmdb.DiskError):
    """A write transaction found the filesystem full (ENOSPC): nothing of it was committed.

    To the cache it is a capacity error (the chunk is not stored, the drop is counted, reads go on); to a
    caller of LMDB it is still the ``lmdb.DiskError`` it was.
    """


class StoredValue(NamedTuple):
    """One value to write.

    Attributes:
        chunk_id: its id.
        value: header + payload (see :mod:`tiercache.tiers.values`).
        depth: its chain depth, None when not known.
    """

    chunk_id: bytes
    value: memoryview | bytes
    depth: int | None = None


def check_ids(chunk_ids: Sequence[bytes], field: str = "chunk_ids") -> None:
    """Raise InvalidArgumentError (naming ``field`` and the index) unless every id is ``bytes``."""
    for i, cid in enumerate(chunk_ids):
        if not isinstance(cid, bytes):
            raise InvalidArgumentError(field, f"[{i}] must be bytes, got {type(cid).__name__}")


def check_dsts(chunk_ids: Sequence[bytes], dsts: Sequence[torch.Tensor]) -> None:
    """Raise InvalidArgumentError unless ids are bytes and each has a strided 1-D ``uint8`` destination."""
    if len(chunk_ids) != len(dsts):
        raise InvalidArgumentError(
            "dsts", f"got {len(dsts)} destinations for {len(chunk_ids)} chunk ids; they must match"
        )
    check_ids(chunk_ids)
    for i, dst in enumerate(dsts):
        if not isinstance(dst, torch.Tensor):
            raise InvalidArgumentError("dsts", f"[{i}] must be a torch.Tensor, got {type(dst).__name__}")
        if dst.dtype != torch.uint8 or dst.dim() != 1 or dst.layout != torch.strided:
            raise InvalidArgumentError(
                "dsts",
                f"[{i}] must be a strided 1-D uint8 tensor, got {dst.dtype} with shape "
                f"{tuple(dst.shape)} ({dst.layout})",
            )


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    """What :func:`read_values` did.

    Attributes:
        copied: per chunk, whether its verified bytes are in its destination.
        corrupt: ids whose stored value failed a check (in read order; may repeat).
    """

    copied: list[bool]
    corrupt: list[bytes]


def read_values(
    env: lmdb.Environment,
    dbs: LmdbDatabases,
    chunk_ids: Sequence[bytes],
    dsts: Sequence[torch.Tensor],
    wanted: Sequence[bool],
) -> ReadOutcome:
    """Copy the verified raw bytes of each ``wanted`` chunk into its destination, in one read transaction.

    A chunk is not copied when its value is gone (deleted since the caller looked), corrupt (reported in
    ``corrupt``) or longer than its destination (replaced by a larger chunk since the caller looked). The
    hot case, a raw value into CPU memory, checks the header with one compare and one unpack (no header
    object); any other value (zstd, or one that fails that check and is parsed again to say why) and any
    other destination take the general path.
    """
    copied = [False] * len(chunk_ids)
    corrupt: list[bytes] = []
    dctx: zstandard.ZstdDecompressor | None = None
    meta_db = dbs.meta
    with env.begin(db=dbs.values, buffers=True) as txn:
        get = txn.get
        for i, (cid, dst) in enumerate(zip(chunk_ids, dsts, strict=True)):
            if not wanted[i]:
                continue
            value = get(cid)
            if value is None:  # deleted since the index was consulted
                continue
            record = get(cid, db=meta_db)
            expected = raw_checksum(value) if dst.is_cpu else None
            if expected is not None:
                why = _foreign(expected, record)
                if why is None:
                    if len(value) - HEADER_BYTES > dst.numel():
                        continue  # replaced by a larger chunk since the index was consulted
                    why = _copy_checked(value, expected, dst.numpy())
            else:
                header = parse_header(value)
                why = header if isinstance(header, str) else _foreign(header.checksum, record)
                if why is None:
                    assert not isinstance(header, str)
                    if header.raw_len > dst.numel():
                        continue
                    dctx = dctx or zstandard.ZstdDecompressor()
                    raw = decode(value, dctx)
                    if isinstance(raw, str):
                        why = raw
                    else:
                        copy_out(raw, dst)
            if why is not None:
                logger.warning("L3 chunk %s is corrupt (%s); dropping it", cid.hex(), why)
                corrupt.append(cid)
                continue
            copied[i] = True
    return ReadOutcome(copied, corrupt)


def write_values(
    env: lmdb.Environment,
    dbs: LmdbDatabases,
    values: Sequence[StoredValue],
    first_seq: int,
    pending: Mapping[bytes, int],
) -> None:
    """Store values with sequence numbers ``first_seq, first_seq + 1, ...`` and their records.

    The pending access-order updates of earlier reads land in the same transaction, first.

    Raises:
        lmdb.MapFullError: the map is full; nothing is stored.
        lmdb.DiskError: the filesystem is full (only without ``writemap``); nothing is stored.
    """
    with env.begin(write=True) as txn:
        _put_order(txn, dbs, pending)
        for i, item in enumerate(values):
            txn.put(item.chunk_id, item.value, db=dbs.values)
            txn.put(item.chunk_id, pack_seq(first_seq + i), db=dbs.order)
            record = record_of(item.value, item.depth)
            if record is not None:
                txn.put(item.chunk_id, record, db=dbs.meta)


def write_order(env: lmdb.Environment, dbs: LmdbDatabases, pending: Mapping[bytes, int]) -> None:
    """Store access-order updates (chunk id -> sequence number) in one transaction."""
    with env.begin(write=True) as txn:
        _put_order(txn, dbs, pending)


def _put_order(txn: lmdb.Transaction, dbs: LmdbDatabases, seqs: Mapping[bytes, int]) -> None:
    if seqs:  # one call for all (a read's flush writes hundreds of them)
        txn.cursor(db=dbs.order).putmulti([(cid, pack_seq(seq)) for cid, seq in seqs.items()])


def delete_values(env: lmdb.Environment, dbs: LmdbDatabases, chunk_ids: Sequence[bytes]) -> None:
    """Delete chunks (values, order and meta records) in one transaction; absent ones are ignored.

    Raises:
        lmdb.MapFullError: the map is too full even for a delete; nothing is deleted.
    """
    with env.begin(write=True) as txn:
        for cid in chunk_ids:
            txn.delete(cid, db=dbs.values)
            txn.delete(cid, db=dbs.order)
            txn.delete(cid, db=dbs.meta)


def delete_corrupt(env: lmdb.Environment, dbs: LmdbDatabases, chunk_ids: Sequence[bytes]) -> list[bytes]:
    """Delete the chunks whose value is corrupt or gone, checked again in the write transaction.

    A chunk replaced by a good value since it was read corrupt is kept.

    Returns:
        The ids whose records were deleted (each once).

    Raises:
        lmdb.MapFullError: the map is too full even for a delete; nothing is deleted.
    """
    removed: list[bytes] = []
    dctx = zstandard.ZstdDecompressor()
    with env.begin(write=True, buffers=True) as txn:
        for cid in dict.fromkeys(chunk_ids):
            value = txn.get(cid, db=dbs.values)
            if value is not None:
                why = foreign(value, txn.get(cid, db=dbs.meta)) or decode(value, dctx)
                if not isinstance(why, str):
                    continue  # replaced by a good value meanwhile
            txn.delete(cid, db=dbs.values)
            txn.delete(cid, db=dbs.order)
            txn.delete(cid, db=dbs.meta)
            removed.append(cid)
    return removed


def _foreign(value_checksum: int, record: memoryview | None) -> str | None:
    """Why a value with a good header holding ``value_checksum`` is not the one written under its id (its
    record names another checksum), or None (it is, or there is no record: an older environment)."""
    written = None if record is None else record_checksum(record)
    if written is not None and written != value_checksum:
        return f"value of another key (checksum {value_checksum:#x}, {written:#x} was written here)"
    return None


def _copy_checked(value: memoryview, expected: int, out: np.ndarray) -> str | None:
    """Copy a well-formed raw value's payload into the front of the CPU array ``out`` and check the bytes
    that arrived against ``expected``, the header's checksum; None when they match, else why not.

    A contiguous ``out`` takes the copy and the hash in one blocked pass (each block hashed where it landed,
    hot in the cache: :func:`~tiercache.checksum.copy_checksum_array`, which releases the interpreter lock
    while bytes move, so the daemon's other threads run meanwhile); a strided one is copied, then the mapped
    bytes are hashed.
    """
    payload = value[HEADER_BYTES:]
    arrived = memoryview(out)[: len(payload)]  # type: ignore[arg-type]  # ndarray exports the buffer protocol
    if arrived.c_contiguous:
        got = copy_checksum_array(out, np.frombuffer(payload, dtype=np.uint8))
    else:
        arrived[:] = payload
        got = checksum(payload)
    return None if got == expected else "payload checksum mismatch"

"""The per-chunk record the L3 tier keeps next to each value: chain depth, value checksum and sizes.

The record lives in LMDB's ``meta`` database under the chunk id and is written in the same transaction as
the value. The depth lets deepest-first eviction survive a restart (see :mod:`tiercache.tiers.depths`). The
checksum is the raw checksum of the value's header as written under this id: a value that later turns up
under the id with another checksum (a value swapped or copied from another key, which passes every check
of its own) is caught as corrupt. The sizes (stored value bytes, payload bytes once decoded) let a warm
start index the environment from the records alone, in one cursor pass over a compact table, without
reading a value (:mod:`tiercache.tiers.lmdb_scan`); every value is still checked when it is read. An
environment written before the record existed has none, and one written before the sizes were has short
records: its values are checked as they always were (and are scanned at open).

A record is 28 bytes, big-endian: depth (``uint32``, :data:`UNKNOWN_DEPTH` when not known), checksum
(``uint64``), stored bytes (``uint64``, header + payload) and payload bytes (``uint64``). The short form of
earlier versions (12 bytes: depth and checksum) is still read.

Primitives:
    UNKNOWN_DEPTH: the stored depth of a chunk whose depth was not known.
    META_BYTES, SHORT_META_BYTES: the lengths of a record and of an earlier version's (sizes absent).
    META_DTYPE: a record as a numpy structured dtype (to parse many at once).
    ChunkMeta: a parsed record.
    pack_meta / unpack_meta: the stored form of a record.
    record_checksum: the checksum of a stored record alone (the read path's check, no parsed record).
    record_of: the record of a value about to be written.
    foreign: why a value is not the one written under its id (None when it is, or cannot be told).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from tiercache.tiers.values import parse_header

UNKNOWN_DEPTH = 0xFFFF_FFFF
"""Stored depth meaning "not known"; deeper chunks are stored as one less (their order among themselves is
lost, nothing else)."""
_META = struct.Struct(">IQQQ")
_SHORT_META = struct.Struct(">IQ")
_RECORD_CHECKSUM = struct.Struct(">4xQ")  # the checksum field, the same place in both forms
META_BYTES = _META.size
"""Bytes of a record (28)."""
SHORT_META_BYTES = _SHORT_META.size
"""Bytes of a record written before the sizes were part of it (12)."""
META_DTYPE = np.dtype([("depth", ">u4"), ("checksum", ">u8"), ("stored_bytes", ">u8"), ("nbytes", ">u8")])
"""A record as a numpy structured dtype (``itemsize`` :data:`META_BYTES`)."""


@dataclass(frozen=True, slots=True)
class ChunkMeta:
    """A chunk's record.

    Attributes:
        depth: its chain depth, None when not known.
        checksum: the raw checksum in the header of the value written under its id.
        stored_bytes: bytes of that value (header + payload), None in a short record.
        nbytes: its payload bytes once decoded, None in a short record.
    """

    depth: int | None
    checksum: int
    stored_bytes: int | None = None
    nbytes: int | None = None


def pack_meta(meta: ChunkMeta) -> bytes:
    """The stored form of a record (a short one when its sizes are not known)."""
    depth = UNKNOWN_DEPTH if meta.depth is None else min(max(meta.depth, 0), UNKNOWN_DEPTH - 1)
    if meta.stored_bytes is None or meta.nbytes is None:
        return _SHORT_META.pack(depth, meta.checksum)
    return _META.pack(depth, meta.checksum, meta.stored_bytes, meta.nbytes)


def unpack_meta(value: memoryview | bytes) -> ChunkMeta | None:
    """The record of a stored value (either form), or None if it is not one (wrong length)."""
    if len(value) == _META.size:
        depth, check, stored, nbytes = _META.unpack(value)
        return ChunkMeta(None if depth == UNKNOWN_DEPTH else int(depth), int(check), int(stored), int(nbytes))
    if len(value) != _SHORT_META.size:
        return None
    depth, check = _SHORT_META.unpack(value)
    return ChunkMeta(None if depth == UNKNOWN_DEPTH else int(depth), int(check))


def record_checksum(value: memoryview | bytes) -> int | None:
    """The checksum of a stored record (either form), or None if it is not one (wrong length); what
    :func:`unpack_meta` would say of it, without the rest."""
    if len(value) != _META.size and len(value) != _SHORT_META.size:
        return None
    (check,) = _RECORD_CHECKSUM.unpack_from(value)
    return int(check)


def record_of(value: memoryview | bytes, depth: int | None) -> bytes | None:
    """The record to store with ``value`` (None for a malformed value, which never reaches a write)."""
    header = parse_header(memoryview(value))
    if isinstance(header, str):
        return None
    return pack_meta(ChunkMeta(depth, header.checksum, len(value), header.raw_len))


def foreign(value: memoryview, record: memoryview | bytes | None) -> str | None:
    """Why ``value`` is not the value written under its id, or None (it is, or there is no record)."""
    meta = None if record is None else unpack_meta(record)
    header = parse_header(value)
    if meta is None or isinstance(header, str):
        return None  # no record (an older environment), or malformed: decoding says why
    if header.checksum != meta.checksum:
        return f"value of another key (checksum {header.checksum:#x}, {meta.checksum:#x} was written here)"
    return None

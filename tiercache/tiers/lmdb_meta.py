"""The per-chunk record the L3 tier keeps next to each value: its chain depth and its value's checksum.

The record lives in LMDB's ``meta`` database under the chunk id and is written in the same transaction as
the value. The depth lets deepest-first eviction survive a restart (see :mod:`tiercache.tiers.depths`). The
checksum is the raw checksum of the value's header as written under this id: a value that later turns up
under the id with another checksum (a value swapped or copied from another key, which passes every check
of its own) is caught as corrupt. An environment written before the record existed has none: its values
are checked as they always were.

A record is 12 bytes, big-endian: depth (``uint32``, :data:`UNKNOWN_DEPTH` when not known) and checksum
(``uint64``).

Primitives:
    UNKNOWN_DEPTH: the stored depth of a chunk whose depth was not known.
    ChunkMeta: a parsed record.
    pack_meta / unpack_meta: the stored form of a record.
    record_of: the record of a value about to be written.
    foreign: why a value is not the one written under its id (None when it is, or cannot be told).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tiercache.tiers.values import parse_header

UNKNOWN_DEPTH = 0xFFFF_FFFF
"""Stored depth meaning "not known"; deeper chunks are stored as one less (their order among themselves is
lost, nothing else)."""
_META = struct.Struct(">IQ")


@dataclass(frozen=True, slots=True)
class ChunkMeta:
    """A chunk's record.

    Attributes:
        depth: its chain depth, None when not known.
        checksum: the raw checksum in the header of the value written under its id.
    """

    depth: int | None
    checksum: int


def pack_meta(meta: ChunkMeta) -> bytes:
    """The stored form of a record."""
    depth = UNKNOWN_DEPTH if meta.depth is None else min(max(meta.depth, 0), UNKNOWN_DEPTH - 1)
    return _META.pack(depth, meta.checksum)


def unpack_meta(value: memoryview | bytes) -> ChunkMeta | None:
    """The record of a stored value, or None if it is not one (wrong length)."""
    if len(value) != _META.size:
        return None
    depth, check = _META.unpack(value)
    return ChunkMeta(None if depth == UNKNOWN_DEPTH else int(depth), int(check))


def record_of(value: memoryview | bytes, depth: int | None) -> bytes | None:
    """The record to store with ``value`` (None for a malformed value, which never reaches a write)."""
    header = parse_header(memoryview(value))
    return None if isinstance(header, str) else pack_meta(ChunkMeta(depth, header.checksum))


def foreign(value: memoryview, record: memoryview | bytes | None) -> str | None:
    """Why ``value`` is not the value written under its id, or None (it is, or there is no record)."""
    meta = None if record is None else unpack_meta(record)
    header = parse_header(value)
    if meta is None or isinstance(header, str):
        return None  # no record (an older environment), or malformed: decoding says why
    if header.checksum != meta.checksum:
        return f"value of another key (checksum {header.checksum:#x}, {meta.checksum:#x} was written here)"
    return None

"""The stored-value format of the persistent tiers: a checksummed header followed by a raw or zstd payload.

Pure functions over byte buffers (no storage, no torch): the L3 LMDB tier stores exactly these values, and
a shared cluster tier can store the same bytes. A value is a fixed :data:`HEADER_BYTES`-long header
followed by the payload. The header is ``struct`` ``<4sBBHQQQQ``, little-endian:

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

A reader verifies the header checksum, the stored length against the value's real length (a truncated
value fails) and the raw checksum; a value that fails any check is malformed, and the functions say why
instead of raising: to a tier, a malformed value is a miss.

A store that keeps the header and the payload as two parts of one atomic record (the shared tier: two
keys in one Redis hash slot, written by one MSET) uses :func:`encode` / :func:`decode_parts`, with the same checks: the payload
is then sent straight from the caller's buffer, never copied behind a header.

Primitives:
    HEADER_BYTES, FORMAT_VERSION, MAGIC: the format's constants.
    MIN_ZSTD_LEVEL, MAX_ZSTD_LEVEL: the range of zstd levels.
    ValueHeader: a parsed header.
    checksum: the xxh3_64 checksum of raw bytes.
    pack_header / parse_header: write a header / read and check one (with the value's length).
    raw_checksum: the raw checksum of a well-formed raw value, in one unpack (the hot read path's check).
    parse_head: read and check a header kept apart from its payload (with the payload's length).
    encode: the header and the payload of raw bytes (the payload is the raw bytes themselves unless
        compressed).
    encode_staged: the value of raw bytes staged behind room for the header (compressed when smaller).
    decode / decode_parts: the verified raw bytes of a value (or of its header and payload), or why it is
        malformed.
    copy_out: copy verified raw bytes into the front of a caller's buffer on any device.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from tiercache import checksum as checked
from tiercache.codec import Codec

MAGIC = b"TCL3"
"""First four bytes of every stored value."""
FORMAT_VERSION = 1
"""Version of the value format written by this module."""
_HEADER = struct.Struct("<4sBBHQQQ")
_HEADER_CHECK = struct.Struct("<Q")
HEADER_BYTES = _HEADER.size + _HEADER_CHECK.size
"""Bytes of the header that precedes every payload (40)."""

MIN_ZSTD_LEVEL = -(1 << 17)
"""Lowest (fastest) zstd level, ``ZSTD_minCLevel()``."""
MAX_ZSTD_LEVEL = zstandard.MAX_COMPRESSION_LEVEL
"""Highest zstd level."""

ByteView = bytes | bytearray | memoryview
"""What the functions read: any contiguous byte buffer."""

_CODEC_IDS = {Codec.RAW: 0, Codec.ZSTD: 1}
_ID_CODECS = {v: k for k, v in _CODEC_IDS.items()}
_RAW_PREFIX = struct.pack("<4sBBH", MAGIC, FORMAT_VERSION, _CODEC_IDS[Codec.RAW], 0)
"""The first bytes of every well-formed raw value's header: magic, version, the raw codec, no flags."""
_RAW_PREFIX_BYTES = len(_RAW_PREFIX)
_RAW_REST = struct.Struct("<QQQQ")  # raw length, stored length, raw checksum, header checksum


@dataclass(frozen=True, slots=True)
class ValueHeader:
    """A parsed, checked header.

    Attributes:
        codec: how the payload is encoded.
        raw_len: payload bytes once decoded.
        stored_len: payload bytes that follow the header.
        checksum: xxh3_64 of the raw bytes.
    """

    codec: Codec
    raw_len: int
    stored_len: int
    checksum: int


def checksum(raw: ByteView) -> int:
    """The xxh3_64 checksum of raw chunk bytes, as stored in the header (:func:`tiercache.checksum.checksum`)."""
    return checked.checksum(raw)


def pack_header(codec: Codec, raw_len: int, stored_len: int, raw_checksum: int) -> bytes:
    """The :data:`HEADER_BYTES` header of a value, its own checksum included."""
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, _CODEC_IDS[codec], 0, raw_len, stored_len, raw_checksum)
    return head + _HEADER_CHECK.pack(checked.checksum(head))


def parse_header(value: memoryview) -> ValueHeader | str:
    """The header of a stored value, or why it is malformed (also checks the value's length)."""
    if len(value) < HEADER_BYTES:
        return f"value of {len(value)} bytes is shorter than the header"
    return _parse(value, len(value) - HEADER_BYTES)


def raw_checksum(value: memoryview) -> int | None:
    """The raw checksum in the header of ``value`` when it is a well-formed raw (uncompressed) value,
    else None (a zstd value, or a malformed one: :func:`parse_header` says why).

    The checks are :func:`parse_header`'s, done with one compare of the fixed prefix, one unpack and no
    parsed header object: a read of a raw value needs the checksum only (the payload is everything after
    the header).
    """
    if len(value) <= HEADER_BYTES or value[:_RAW_PREFIX_BYTES] != _RAW_PREFIX:
        return None
    raw_len, stored_len, raw_check, check = _RAW_REST.unpack_from(value, _RAW_PREFIX_BYTES)
    if (
        raw_len != stored_len
        or stored_len != len(value) - HEADER_BYTES
        or checked.checksum(value[: _HEADER.size]) != check
    ):
        return None
    return int(raw_check)


def parse_head(head: memoryview, payload_len: int) -> ValueHeader | str:
    """The header ``head`` (exactly :data:`HEADER_BYTES`) of a payload of ``payload_len`` bytes kept apart
    from it, or why it is malformed; the payload's checksum is left to the caller (who may check the bytes
    where they land, see :func:`decode_parts` for the all-in-one form)."""
    if len(head) != HEADER_BYTES:
        return f"header of {len(head)} bytes, expected {HEADER_BYTES}"
    return _parse(head, payload_len)


def _parse(head: memoryview, payload_len: int) -> ValueHeader | str:
    """The header at the front of ``head``, checked against a payload of ``payload_len`` bytes."""
    if len(head) < HEADER_BYTES:
        return f"header of {len(head)} bytes is shorter than {HEADER_BYTES}"
    (check,) = _HEADER_CHECK.unpack_from(head, _HEADER.size)
    if checked.checksum(head[: _HEADER.size]) != check:
        return "header checksum mismatch"
    magic, version, codec_id, flags, raw_len, stored_len, raw_checksum = _HEADER.unpack_from(head, 0)
    if magic != MAGIC:
        return f"bad magic {magic!r}"
    if version != FORMAT_VERSION:
        return f"unsupported format version {version}"
    codec = _ID_CODECS.get(codec_id)
    if codec is None:
        return f"unknown codec {codec_id}"
    if flags != 0:
        return f"unknown flags {flags:#x}"
    if raw_len <= 0:
        return f"raw length {raw_len} is not positive"
    if stored_len != payload_len:
        return f"truncated: header says {stored_len} payload bytes, value holds {payload_len}"
    if codec is Codec.RAW and stored_len != raw_len:
        return f"raw payload of {stored_len} bytes for a raw length of {raw_len}"
    return ValueHeader(codec, raw_len, stored_len, raw_checksum)


def encode(
    raw: ByteView, cctx: zstandard.ZstdCompressor | None, raw_checksum: int | None = None
) -> tuple[bytes, ByteView]:
    """The header and the payload of ``raw``: with ``cctx`` the zstd compression of ``raw`` when that is
    smaller (a new ``bytes``), otherwise ``raw`` itself (no copy). ``raw_checksum``: the checksum of
    ``raw`` when the caller has just verified it (not hashed again; a wrong one makes a corrupt value)."""
    if raw_checksum is None:
        raw_checksum = checksum(raw)
    if cctx is not None:
        compressed = cctx.compress(raw)
        if len(compressed) < len(raw):
            return pack_header(Codec.ZSTD, len(raw), len(compressed), raw_checksum), compressed
    return pack_header(Codec.RAW, len(raw), len(raw), raw_checksum), raw


def encode_staged(
    staged: memoryview, cctx: zstandard.ZstdCompressor | None, raw_checksum: int | None = None
) -> memoryview | bytes:
    """The value of the raw bytes ``staged[HEADER_BYTES:]``: header + payload, compressed when smaller.

    ``staged`` is a writable byte view with :data:`HEADER_BYTES` of room in front of the raw bytes. With
    ``cctx`` the payload is zstd-compressed and kept so only when that makes it smaller (a new ``bytes``);
    otherwise the header is written into the room in front and the value is ``staged`` itself: no copy.
    ``raw_checksum``: the checksum of the raw bytes when it was taken as they were copied in (not hashed
    again), as in :func:`encode`.
    """
    header, payload = encode(staged[HEADER_BYTES:], cctx, raw_checksum)
    if isinstance(payload, bytes):
        return b"".join((header, payload))
    staged[:HEADER_BYTES] = header
    return staged


def decode(value: memoryview, dctx: zstandard.ZstdDecompressor) -> memoryview | bytes | str:
    """The verified raw bytes of a stored value (a view of ``value`` for raw payloads), or what is wrong."""
    if len(value) < HEADER_BYTES:
        return f"value of {len(value)} bytes is shorter than the header"
    return decode_parts(value[:HEADER_BYTES], value[HEADER_BYTES:], dctx)


def decode_parts(
    head: memoryview, payload: memoryview, dctx: zstandard.ZstdDecompressor
) -> memoryview | bytes | str:
    """The verified raw bytes of a value kept as header and payload (a view of ``payload`` when raw), or
    what is wrong; the same checks as :func:`decode`."""
    header = parse_head(head, len(payload))
    if isinstance(header, str):
        return header
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
    if checksum(raw) != header.checksum:
        return "payload checksum mismatch"
    return raw


def copy_out(raw: ByteView, dst: torch.Tensor) -> None:
    """Copy verified raw bytes into the front of ``dst`` (any device; a destination that is not contiguous
    CPU memory is staged through a CPU tensor)."""
    src = np.frombuffer(raw, dtype=np.uint8)
    n = src.size
    if dst.device.type == "cpu" and dst.is_contiguous():
        np.copyto(dst[:n].numpy(), src)
    else:
        staging = torch.empty(n, dtype=torch.uint8)
        np.copyto(staging.numpy(), src)
        dst[:n].copy_(staging)

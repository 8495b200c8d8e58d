"""The stored-value format as pure functions: round trips, the header layout and every malformed case.

No storage is involved: values are built in plain byte buffers, as a shared cluster tier would build them.
"""

from __future__ import annotations

import re
import struct

import pytest
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.codec import Codec
from tiercache.tiers.values import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAGIC,
    ValueHeader,
    checksum,
    decode,
    encode_staged,
    pack_header,
    parse_header,
    raw_checksum,
)


def staged(raw: bytes) -> memoryview:
    """A writable buffer with room for the header, then ``raw``."""
    return memoryview(bytearray(HEADER_BYTES) + raw)


def encode(raw: bytes, codec: Codec, level: int = 3) -> bytes:
    cctx = zstandard.ZstdCompressor(level=level) if codec is Codec.ZSTD else None
    return bytes(encode_staged(staged(raw), cctx))


def reseal(value: bytearray) -> None:
    """Recompute the header checksum after editing header fields (a well-formed but wrong header)."""
    value[32:40] = xxhash.xxh3_64_intdigest(bytes(value[:32])).to_bytes(8, "little")


@settings(max_examples=200, deadline=None)
@given(
    raw=st.one_of(
        st.binary(min_size=1, max_size=4096),
        st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 2000)),
    ),
    codec=st.sampled_from(list(Codec)),
    level=st.sampled_from([-5, 1, 3, 19]),
)
def test_round_trip(raw: bytes, codec: Codec, level: int) -> None:
    value = encode(raw, codec, level)
    header = parse_header(memoryview(value))
    assert isinstance(header, ValueHeader)
    assert header.raw_len == len(raw) and header.stored_len == len(value) - HEADER_BYTES
    assert header.checksum == checksum(raw)
    # zstd is kept only when it is smaller; the value is never larger than header + raw.
    assert header.codec is Codec.RAW or (codec is Codec.ZSTD and header.stored_len < len(raw))
    assert len(value) <= HEADER_BYTES + len(raw)
    assert bytes(decode(memoryview(value), zstandard.ZstdDecompressor())) == raw
    # the read path's one-unpack check: the checksum of a raw value, None for a compressed one
    assert raw_checksum(memoryview(value)) == (header.checksum if header.codec is Codec.RAW else None)


def test_raw_value_is_the_staging_buffer_itself() -> None:
    buf = staged(b"abc" * 100)
    value = encode_staged(buf, None)
    assert value is buf  # no copy: the header went into the room in front
    assert bytes(buf[HEADER_BYTES:]) == b"abc" * 100


def test_compressible_payload_is_stored_compressed() -> None:
    raw = bytes(64 << 10)
    value = encode(raw, Codec.ZSTD)
    header = parse_header(memoryview(value))
    assert isinstance(header, ValueHeader) and header.codec is Codec.ZSTD
    assert len(value) < HEADER_BYTES + 1024


def test_header_layout() -> None:
    raw = b"payload bytes"
    value = encode(raw, Codec.RAW)
    magic, version, codec, flags, raw_len, stored_len, raw_check, head_check = struct.unpack_from(
        "<4sBBHQQQQ", value
    )
    assert (magic, version, codec, flags) == (MAGIC, FORMAT_VERSION, 0, 0)
    assert raw_len == stored_len == len(raw)
    assert raw_check == xxhash.xxh3_64_intdigest(raw)
    assert head_check == xxhash.xxh3_64_intdigest(value[:32])
    assert value[:HEADER_BYTES] == pack_header(Codec.RAW, len(raw), len(raw), raw_check)
    assert HEADER_BYTES == 40 and MAGIC == b"TCL3" and FORMAT_VERSION == 1


def _edit(value: bytes, offset: int, new: bytes, keep_header_check: bool) -> bytes:
    out = bytearray(value)
    out[offset : offset + len(new)] = new
    if keep_header_check:
        reseal(out)
    return bytes(out)


RAW = bytes(range(256)) * 4
GOOD = encode(RAW, Codec.RAW)
ZGOOD = encode(bytes(4096), Codec.ZSTD)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (GOOD[:20], "shorter than the header"),
        (b"", "shorter than the header"),
        (_edit(GOOD, 0, b"X", keep_header_check=False), "header checksum mismatch"),
        (_edit(GOOD, 35, b"\x00", keep_header_check=False), "header checksum mismatch"),
        (_edit(GOOD, 0, b"NOPE", keep_header_check=True), "bad magic"),
        (_edit(GOOD, 4, b"\x02", keep_header_check=True), "unsupported format version 2"),
        (_edit(GOOD, 5, b"\x07", keep_header_check=True), "unknown codec 7"),
        (_edit(GOOD, 6, b"\x01\x00", keep_header_check=True), "unknown flags"),
        (_edit(GOOD, 8, bytes(8), keep_header_check=True), "raw length 0 is not positive"),
        (GOOD[:-1], "truncated"),
        (GOOD + b"\x00", "truncated"),
        (_edit(GOOD, 8, (len(RAW) + 1).to_bytes(8, "little"), keep_header_check=True), "raw payload of"),
    ],
)
def test_malformed_headers_say_why(value: bytes, why: str) -> None:
    result = parse_header(memoryview(value))
    assert isinstance(result, str) and why in result
    assert raw_checksum(memoryview(value)) is None  # the read path's fast check refuses it too
    decoded = decode(memoryview(value), zstandard.ZstdDecompressor())
    assert isinstance(decoded, str) and why in decoded


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (_edit(GOOD, HEADER_BYTES + 10, b"\xff", keep_header_check=False), "payload checksum mismatch"),
        (_edit(ZGOOD, len(ZGOOD) - 3, b"\xff", keep_header_check=False), "zstd|payload checksum mismatch"),
        (_edit(ZGOOD, 8, (4095).to_bytes(8, "little"), keep_header_check=True), "zstd frame declares 4096"),
    ],
)
def test_damaged_payloads_say_why(value: bytes, why: str) -> None:
    header = parse_header(memoryview(value))
    assert isinstance(header, ValueHeader)  # the header itself is fine
    assert raw_checksum(memoryview(value)) == (header.checksum if header.codec is Codec.RAW else None)
    decoded = decode(memoryview(value), zstandard.ZstdDecompressor())
    assert isinstance(decoded, str) and re.search(why, decoded)

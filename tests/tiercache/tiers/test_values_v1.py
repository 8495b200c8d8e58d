"""Values of format version 1, written by a frozen writer, still read bit-exact (issue 30).

The writer below is the value format as it stood when checked copies came in (header ``<4sBBHQQQ`` + the
header's xxh3-64, the raw bytes' xxh3-64 in the header), written out here on purpose instead of calling
:mod:`tiercache.tiers.values`: a change to the writer or the checksum must not silently change what this
test expects. An L3 environment is laid down by hand with these values (no per-chunk records: the oldest
kind of environment) and opened by today's tier; every chunk reads back bit-exact, and a flipped payload
byte is still a miss.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import lmdb
import pytest
import torch
import xxhash
import zstandard

from tiercache.keys import CHUNK_ID_BYTES
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.lmdb_env import VALUES_DB

_V1_HEAD = struct.Struct("<4sBBHQQQ")


def v1_value(raw: bytes, zstd: bool = False) -> bytes:
    """A stored value of format version 1: magic, version 1, codec, no flags, lengths, xxh3-64 of the raw
    bytes, then the xxh3-64 of those 32 header bytes, then the payload (raw, or one zstd frame)."""
    payload = zstandard.ZstdCompressor(level=3).compress(raw) if zstd else raw
    head = _V1_HEAD.pack(
        b"TCL3", 1, 1 if zstd else 0, 0, len(raw), len(payload), xxhash.xxh3_64_intdigest(raw)
    )
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head)) + payload


def cid(i: int) -> bytes:
    return hashlib.blake2b(b"v1:%d" % i, digest_size=CHUNK_ID_BYTES).digest()


def chunk(i: int, nbytes: int) -> bytes:
    gen = torch.Generator().manual_seed(i)
    values = torch.randn((nbytes + 1) // 2, generator=gen).to(torch.bfloat16).view(torch.uint8)
    return bytes(values[:nbytes].numpy())


SIZES = (1, 4097, 256 << 10, (1 << 20) + 3)


def _lay_down(path: Path, values: dict[bytes, bytes]) -> None:
    """An environment holding ``values`` in its values database only, written with plain py-lmdb."""
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=4)
    try:
        db = env.open_db(VALUES_DB)
        with env.begin(write=True) as txn:
            for key, value in values.items():
                txn.put(key, value, db=db)
    finally:
        env.close()


def _open(path: Path) -> LmdbTier:
    return LmdbTier(LmdbTierConfig(path=str(path), capacity_bytes=32 << 20))


@pytest.mark.parametrize("zstd", [False, True])
def test_v1_values_laid_down_by_hand_read_bit_exact(tmp_path: Path, zstd: bool) -> None:
    raws = {cid(i): chunk(i, n) for i, n in enumerate(SIZES)}
    _lay_down(tmp_path, {k: v1_value(raw, zstd) for k, raw in raws.items()})
    tier = _open(tmp_path)
    try:
        assert tier.contains(list(raws)) == [True] * len(raws)
        for key, raw in raws.items():
            dst = torch.zeros(len(raw) + 7, dtype=torch.uint8)
            assert tier.read_into([key], [dst]) == [True]
            assert bytes(dst[: len(raw)].numpy()) == raw
            assert not dst[len(raw) :].any()
        assert tier.usage().corrupt_reads == 0
    finally:
        tier.close()


@pytest.mark.parametrize("offset", [0, 1, (128 << 10) - 1, 128 << 10, 256 << 10, -1])
def test_a_flipped_byte_in_a_v1_value_is_still_a_miss(tmp_path: Path, offset: int) -> None:
    raw = chunk(7, (256 << 10) + 1)
    value = bytearray(v1_value(raw))
    value[40 + offset if offset >= 0 else offset] ^= 0x01
    _lay_down(tmp_path, {cid(7): bytes(value)})
    tier = _open(tmp_path)
    try:
        dst = torch.zeros(len(raw), dtype=torch.uint8)
        assert tier.read_into([cid(7)], [dst]) == [False]
        assert tier.usage().corrupt_reads == 1
        assert tier.contains([cid(7)]) == [False]
    finally:
        tier.close()


def test_todays_writer_still_writes_version_1_values(tmp_path: Path) -> None:
    """What the tier writes now, from a source copied and hashed in one pass, is the frozen writer's value
    byte for byte: old and new values are one format."""
    raws = {cid(i): chunk(i, n) for i, n in enumerate(SIZES)}
    tier = _open(tmp_path)
    try:
        slots = tier.reserve(list(raws), [len(r) for r in raws.values()])
        srcs = [torch.frombuffer(bytearray(r), dtype=torch.uint8) for r in raws.values()]
        tier.commit_from(slots, srcs)
    finally:
        tier.close()
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=4, readonly=True)
    try:
        with env.begin(db=env.open_db(VALUES_DB, create=False)) as txn:
            for key, raw in raws.items():
                assert txn.get(key) == v1_value(raw)
    finally:
        env.close()

"""Opening an L3 environment: from the per-chunk records alone when they are complete, else from every value.

Real LMDB environments under tmp_path, written by the real tier. An environment this version wrote is
indexed from its records (no value read) with the same chunks, sizes, depths and use order a value scan
finds; an older one (short records, or none) is scanned value by value, keeps its depths and checksums, and
has its records completed so that its next open is a record scan; a value damaged while the tier was closed
is not seen by a record scan but is still a counted miss when read.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import torch

from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.lmdb_env import META_DB, VALUES_DB, open_environment
from tiercache.tiers.lmdb_meta import SHORT_META_BYTES, ChunkMeta, pack_meta, record_checksum, unpack_meta
from tiercache.tiers.lmdb_scan import FoundChunks, ScanKind
from tiercache.tiers.values import HEADER_BYTES

DEPTHS = {bytes([i]) * 48: 10 + i for i in range(6)}


def _config(tmp_path: Path) -> LmdbTierConfig:
    return LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=1 << 20)


def _write(tmp_path: Path) -> list[bytes]:
    """Six chunks of sizes 100..600 with depths 10..15 (the last one without a depth), read in a new order."""
    tier = LmdbTier(_config(tmp_path))
    ids = list(DEPTHS)
    tier.bind_depths(lambda cid: DEPTHS[cid] if cid != ids[-1] else None)
    for i, cid in enumerate(ids):
        slots = tier.reserve([cid], [100 * (i + 1)])
        slots[0].buffer.fill_(i)
        tier.commit(slots)
    dst = torch.empty(600, dtype=torch.uint8)
    assert tier.read_into([ids[1], ids[0]], [dst, dst]) == [True, True]  # now the most recent, in order
    tier.close()
    return [*ids[2:], ids[1], ids[0]]


def _open(tmp_path: Path) -> FoundChunks:
    config = _config(tmp_path)
    opened = open_environment(
        config.path,
        map_size_bytes=config.effective_map_size_bytes,
        durable=False,
        preallocate_bytes=config.preallocate_bytes,
    )
    opened.env.close()
    return opened.found


def _expected(order: list[bytes]) -> tuple[list[int], list[int], list[int | None]]:
    ids = list(DEPTHS)
    nbytes = [100 * (ids.index(cid) + 1) for cid in order]
    depths = [None if cid == ids[-1] else DEPTHS[cid] for cid in order]
    return [n + HEADER_BYTES for n in nbytes], nbytes, depths


def _rewrite_records(tmp_path: Path, short: bool) -> None:
    """Make the environment look older: short records (``short``) or none at all."""
    env = lmdb.open(str(tmp_path / "l3"), max_dbs=3, map_size=_config(tmp_path).effective_map_size_bytes)
    with env.begin(write=True) as txn:
        meta = env.open_db(META_DB, txn=txn)
        if short:
            for key, value in list(txn.cursor(db=meta)):
                record = unpack_meta(value)
                assert record is not None
                txn.put(key, pack_meta(ChunkMeta(record.depth, record.checksum)), db=meta)
        else:
            txn.drop(meta, delete=True)
    env.close()


def test_an_environment_of_this_version_is_indexed_from_its_records(tmp_path: Path) -> None:
    order = _write(tmp_path)
    found = _open(tmp_path)
    stored, nbytes, depths = _expected(order)
    assert found.kind is ScanKind.RECORDS
    assert (found.ids, found.stored_bytes, found.nbytes, found.depths) == (order, stored, nbytes, depths)
    assert found.last_seq == 8 and found.dropped == 0


def test_short_records_are_scanned_from_the_values_and_completed(tmp_path: Path) -> None:
    order = _write(tmp_path)
    _rewrite_records(tmp_path, short=True)
    stored, nbytes, depths = _expected(order)
    first = _open(tmp_path)
    assert first.kind is ScanKind.VALUES
    assert (first.ids, first.stored_bytes, first.nbytes, first.depths) == (order, stored, nbytes, depths)
    again = _open(tmp_path)
    assert again.kind is ScanKind.RECORDS
    assert (again.ids, again.stored_bytes, again.nbytes, again.depths) == (order, stored, nbytes, depths)


def test_an_environment_without_records_opens_and_gains_them(tmp_path: Path) -> None:
    order = _write(tmp_path)
    _rewrite_records(tmp_path, short=False)
    stored, nbytes, _ = _expected(order)
    first = _open(tmp_path)
    assert first.kind is ScanKind.VALUES
    assert (first.ids, first.stored_bytes, first.nbytes) == (order, stored, nbytes)
    assert first.depths == [None] * len(order)  # depths were never known to it
    again = _open(tmp_path)
    assert again.kind is ScanKind.RECORDS and again.ids == order
    tier = LmdbTier(_config(tmp_path))
    try:
        dst = torch.empty(600, dtype=torch.uint8)
        assert tier.read_into(order, [dst] * len(order)) == [True] * len(order)
    finally:
        tier.close()


def test_a_value_without_a_record_makes_the_open_scan_the_values(tmp_path: Path) -> None:
    _write(tmp_path)
    extra = b"\x77" * 48
    env = lmdb.open(str(tmp_path / "l3"), max_dbs=3, map_size=_config(tmp_path).effective_map_size_bytes)
    with env.begin(write=True) as txn:
        values = env.open_db(VALUES_DB, txn=txn)
        txn.put(extra, b"not a value", db=values)  # one more value than records: the counts disagree
    env.close()
    found = _open(tmp_path)
    assert found.kind is ScanKind.VALUES
    assert extra not in found.ids and found.dropped == 1 and len(found.ids) == len(DEPTHS)


def test_records_of_the_short_form_still_parse() -> None:
    short = pack_meta(ChunkMeta(7, 0xABC))
    assert len(short) == SHORT_META_BYTES
    assert unpack_meta(short) == ChunkMeta(7, 0xABC)
    full = pack_meta(ChunkMeta(None, 5, 140, 100))
    assert unpack_meta(full) == ChunkMeta(None, 5, 140, 100)
    assert unpack_meta(full[:-1]) is None
    # the read path's checksum-only look at a record says what unpack_meta says of it
    assert record_checksum(short) == 0xABC and record_checksum(memoryview(full)) == 5
    assert record_checksum(full[:-1]) is None and record_checksum(b"") is None


def test_the_tier_index_shares_one_tuple_per_distinct_size_and_depth(tmp_path: Path) -> None:
    tier = LmdbTier(_config(tmp_path))
    ids = [bytes([i]) * 48 for i in range(8)]
    tier.bind_depths(lambda cid: cid[0] % 2)  # two depths, one size: two distinct triples
    slots = tier.reserve(ids, [64] * len(ids))
    for slot in slots:
        slot.buffer.fill_(3)
    tier.commit(slots)
    tier.close()
    index = _open(tmp_path).index()
    assert set(index) == set(ids)
    assert {index[cid] for cid in ids} == {(64 + HEADER_BYTES, 64, 0), (64 + HEADER_BYTES, 64, 1)}
    assert len({id(index[cid]) for cid in ids}) == 2


def test_order_records_are_matched_by_key_when_one_is_missing(tmp_path: Path) -> None:
    order = _write(tmp_path)
    env = lmdb.open(str(tmp_path / "l3"), max_dbs=3, map_size=_config(tmp_path).effective_map_size_bytes)
    with env.begin(write=True) as txn:
        assert txn.delete(order[-1], db=env.open_db(b"order", txn=txn))  # the most recent loses its number
    env.close()
    found = _open(tmp_path)
    assert found.kind is ScanKind.RECORDS
    assert found.ids == [order[-1], *order[:-1]]  # a chunk without a number goes first
    assert found.last_seq == 7

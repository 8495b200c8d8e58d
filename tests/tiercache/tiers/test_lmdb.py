"""Tests specific to the L3 LMDB tier: value format, checksums, warm restart, access order, map size.

The protocol itself is covered by the shared tier conformance suite. Values are tampered with through a
separate process (LMDB forbids opening one environment twice in one process), both while the tier is
open (the read path must catch it) and while it is closed (the open-time scan or the read path must).
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import tiercache.tiers.values as values
from tiercache.codec import Codec
from tiercache.errors import CapacityError, ConflictError, InvalidArgumentError
from tiercache.keys import CHUNK_ID_BYTES
from tiercache.tiers.base import TierLevel
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.staging import StagingPool
from tiercache.tiers.values import HEADER_BYTES, MAGIC

REPO_ROOT = Path(values.__file__).resolve().parents[2]

OpenTier = Callable[..., LmdbTier]


def cid(i: int) -> bytes:
    """A well-formed chunk id."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=CHUNK_ID_BYTES).digest()


def bf16_bytes(nbytes: int, seed: int = 0) -> torch.Tensor:
    """Realistic KV bytes: random normal values in bfloat16 (barely compressible)."""
    assert nbytes % 2 == 0
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(nbytes // 2, generator=gen).to(torch.bfloat16).view(torch.uint8).clone()


def random_bytes(nbytes: int, seed: int = 0) -> torch.Tensor:
    """Incompressible bytes."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def compressible_bytes(nbytes: int, seed: int = 0) -> torch.Tensor:
    """Highly compressible bytes (a short repeated pattern, like zero-padded KV)."""
    pattern = torch.arange(seed % 7, seed % 7 + 16, dtype=torch.uint8)
    return pattern.repeat(nbytes // 16 + 1)[:nbytes].clone()


def put(tier: LmdbTier, ids: Sequence[bytes], payloads: Sequence[torch.Tensor]) -> None:
    """Reserve, fill and commit chunks in one batch."""
    slots = tier.reserve(ids, [p.numel() for p in payloads])
    for slot, payload in zip(slots, payloads, strict=True):
        slot.buffer.copy_(payload)
    tier.commit(slots)


def get(tier: LmdbTier, chunk_id: bytes, nbytes: int) -> torch.Tensor | None:
    """Read one chunk, or None on a miss."""
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    return dst if tier.read_into([chunk_id], [dst])[0] else None


_TAMPER = """
import sys, lmdb, xxhash
path, cid, op, arg, map_size = sys.argv[1:6]
arg = int(arg)
env = lmdb.open(path, max_dbs=2, map_size=int(map_size))
db = env.open_db(b"values")
with env.begin(write=True, db=db) as txn:
    key = bytes.fromhex(cid)
    v = bytearray(txn.get(key))
    if op == "flip":
        v[arg] ^= 0x5A
    elif op == "truncate":
        del v[len(v) - arg:]
    elif op == "extend":
        v += bytes(arg)
    elif op == "version":
        v[4] = arg
        v[32:40] = xxhash.xxh3_64_intdigest(bytes(v[:32])).to_bytes(8, "little")
    elif op == "short":
        del v[arg:]
    else:
        raise SystemExit("unknown op " + op)
    txn.put(key, bytes(v))
env.close()
"""


def tamper(tier_or_config: LmdbTier | LmdbTierConfig, chunk_id: bytes, op: str, arg: int) -> None:
    """Rewrite one stored value from another process (works whether the tier is open or closed)."""
    config = tier_or_config.config if isinstance(tier_or_config, LmdbTier) else tier_or_config
    args = [config.path, chunk_id.hex(), op, str(arg), str(config.effective_map_size_bytes)]
    subprocess.run([sys.executable, "-c", _TAMPER, *args], check=True, timeout=60)


def raw_value(config: LmdbTierConfig, chunk_id: bytes) -> bytes | None:
    """The stored value of a chunk, read from another process."""
    code = (
        "import sys, lmdb\n"
        "env = lmdb.open(sys.argv[1], max_dbs=2, map_size=int(sys.argv[3]), readonly=True)\n"
        "db = env.open_db(b'values', create=False)\n"
        "with env.begin(db=db) as txn:\n"
        "    v = txn.get(bytes.fromhex(sys.argv[2]))\n"
        "sys.stdout.write('' if v is None else v.hex())\n"
    )
    args = [config.path, chunk_id.hex(), str(config.effective_map_size_bytes)]
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return bytes.fromhex(out.stdout) if out.stdout else None


@pytest.fixture
def open_tier(tmp_path: Path) -> Iterator[OpenTier]:
    """Factory of tiers on ``tmp_path/l3`` (by default); every tier is closed at teardown."""
    tiers: list[LmdbTier] = []

    def _open(**kwargs: Any) -> LmdbTier:
        kwargs.setdefault("path", str(tmp_path / "l3"))
        kwargs.setdefault("capacity_bytes", 8 << 20)
        tier = LmdbTier(LmdbTierConfig(**kwargs))
        tiers.append(tier)
        return tier

    yield _open
    for tier in tiers:
        tier.close()


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"path": ""}, "path"),
        ({"capacity_bytes": 0}, "capacity_bytes"),
        ({"capacity_bytes": -1}, "capacity_bytes"),
        ({"capacity_bytes": True}, "capacity_bytes"),
        ({"capacity_bytes": 1.5}, "capacity_bytes"),
        ({"codec": "zstd"}, "codec"),
        ({"zstd_level": 23}, "zstd_level"),
        ({"zstd_level": values.MIN_ZSTD_LEVEL - 1}, "zstd_level"),
        ({"zstd_level": True}, "zstd_level"),
        ({"zstd_level": "3"}, "zstd_level"),
        ({"durable": 1}, "durable"),
        ({"map_size_bytes": 0}, "map_size_bytes"),
        ({"map_size_bytes": 1.0}, "map_size_bytes"),
    ],
)
def test_config_rejects_bad_values(tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    base: dict[str, Any] = {"path": str(tmp_path / "l3"), "capacity_bytes": 1 << 20}
    with pytest.raises(InvalidArgumentError) as info:
        LmdbTierConfig(**{**base, **kwargs})
    assert info.value.field == field


def test_config_defaults_and_codec_names(tmp_path: Path) -> None:
    config = LmdbTierConfig(path=str(tmp_path), capacity_bytes=1 << 30)
    assert config.codec is Codec.RAW and config.zstd_level == 3 and not config.durable
    assert config.effective_map_size_bytes == 4 << 30
    assert LmdbTierConfig(path=str(tmp_path), capacity_bytes=1 << 20).effective_map_size_bytes == (
        1 << 20
    ) + (1 << 30)
    assert LmdbTierConfig(str(tmp_path), 1 << 20, map_size_bytes=12345).effective_map_size_bytes == 12345
    assert Codec.from_name("ZSTD") is Codec.ZSTD
    with pytest.raises(InvalidArgumentError, match="raw, zstd") as info:
        Codec.from_name("lz4")
    assert info.value.field == "codec"


def test_open_on_a_file_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_bytes(b"x")
    with pytest.raises(InvalidArgumentError) as info:
        LmdbTier(LmdbTierConfig(path=str(target), capacity_bytes=1 << 20))
    assert info.value.field == "path"


# ------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("make", [bf16_bytes, random_bytes, compressible_bytes])
def test_round_trip_is_bit_exact(
    open_tier: OpenTier, codec: Codec, make: Callable[[int, int], torch.Tensor]
) -> None:
    tier = open_tier(codec=codec)
    assert tier.level is TierLevel.L3
    sizes = [2, 4096, 65536, 300_002]
    payloads = [make(n, i) for i, n in enumerate(sizes)]
    ids = [cid(i) for i in range(len(sizes))]
    put(tier, ids, payloads)
    for chunk_id, payload in zip(ids, payloads, strict=True):
        got = get(tier, chunk_id, payload.numel())
        assert got is not None and torch.equal(got, payload)
    # A larger destination is fine; bytes past the chunk are left alone.
    dst = torch.full((sizes[1] + 100,), 7, dtype=torch.uint8)
    assert tier.read_into([ids[1]], [dst]) == [True]
    assert torch.equal(dst[: sizes[1]], payloads[1]) and bool((dst[sizes[1] :] == 7).all())
    usage = tier.usage()
    assert usage.chunks == len(sizes) and usage.reserved_bytes == 0 and usage.corrupt_reads == 0
    raw_total = sum(HEADER_BYTES + n for n in sizes)
    if codec is Codec.ZSTD and make is compressible_bytes:
        assert usage.used_bytes < raw_total // 10
    elif codec is Codec.RAW or make is random_bytes:
        assert usage.used_bytes == raw_total
    assert usage.used_bytes <= raw_total


def test_strided_destination(open_tier: OpenTier) -> None:
    tier = open_tier()
    payload = bf16_bytes(1000)
    put(tier, [cid(0)], [payload])
    backing = torch.zeros(2000, dtype=torch.uint8)
    assert tier.read_into([cid(0)], [backing[::2]]) == [True]
    assert torch.equal(backing[::2], payload) and bool((backing[1::2] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("codec", list(Codec))
def test_read_into_cuda_destination(open_tier: OpenTier, codec: Codec) -> None:
    tier = open_tier(codec=codec)
    payload = compressible_bytes(1 << 20)
    put(tier, [cid(0)], [payload])
    dst = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    assert tier.read_into([cid(0)], [dst]) == [True]
    assert torch.equal(dst.cpu(), payload)


def test_stored_value_format(open_tier: OpenTier) -> None:
    tier = open_tier(codec=Codec.ZSTD)
    small, big = random_bytes(1000), compressible_bytes(50_000)
    put(tier, [cid(0), cid(1)], [small, big])
    config = tier.config
    tier.close()
    for chunk_id, payload, codec_id in ((cid(0), small, 0), (cid(1), big, 1)):
        value = raw_value(config, chunk_id)
        assert value is not None
        magic, version, codec, flags, raw_len, stored_len, checksum, head_check = struct.unpack_from(
            "<4sBBHQQQQ", value
        )
        assert (magic, version, codec, flags) == (MAGIC, values.FORMAT_VERSION, codec_id, 0)
        assert raw_len == payload.numel() and stored_len == len(value) - HEADER_BYTES
        assert checksum == xxhash.xxh3_64_intdigest(payload.numpy().tobytes())
        assert head_check == xxhash.xxh3_64_intdigest(value[:32])
    assert HEADER_BYTES == 40


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=5),
    codec=st.sampled_from(list(Codec)),
    kind=st.sampled_from(["random", "repeat"]),
    level=st.sampled_from([-5, 1, 3, 19]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_round_trip_property(sizes: list[int], codec: Codec, kind: str, level: int, seed: int) -> None:
    make = random_bytes if kind == "random" else compressible_bytes
    payloads = [make(n, seed + i) for i, n in enumerate(sizes)]
    ids = [cid(seed * 10 + i) for i in range(len(sizes))]
    with tempfile.TemporaryDirectory() as tmp:
        tier = LmdbTier(LmdbTierConfig(path=tmp, capacity_bytes=1 << 20, codec=codec, zstd_level=level))
        try:
            put(tier, ids, payloads)
            assert tier.entries() == [(i, p.numel()) for i, p in zip(ids, payloads, strict=True)]
            for chunk_id, payload in zip(ids, payloads, strict=True):
                got = get(tier, chunk_id, payload.numel())
                assert got is not None and torch.equal(got, payload)
            assert tier.usage().used_bytes <= sum(tier.charge(n) for n in sizes)
        finally:
            tier.close()


# ------------------------------------------------------------------------------------------ warm restart


@pytest.mark.parametrize("codec", list(Codec))
def test_warm_restart_keeps_every_chunk_and_the_order(open_tier: OpenTier, codec: Codec) -> None:
    tier = open_tier(codec=codec)
    rng = random.Random(1)
    payloads: dict[bytes, torch.Tensor] = {}
    for batch in range(10):
        ids = [cid(batch * 10 + j) for j in range(rng.randint(1, 6))]
        data = [
            (bf16_bytes if j % 2 else compressible_bytes)(2 * rng.randint(1, 20_000), batch * 10 + j)
            for j in range(len(ids))
        ]
        put(tier, ids, data)
        payloads.update(zip(ids, data, strict=True))
    for chunk_id in rng.sample(sorted(payloads), 15):  # reshuffle the access order
        assert get(tier, chunk_id, payloads[chunk_id].numel()) is not None
    tier.delete([next(iter(payloads))])
    del payloads[next(iter(payloads))]
    before_entries, before_usage = tier.entries(), tier.usage()
    tier.close()
    tier.close()  # idempotent

    again = open_tier(codec=codec)
    assert again.entries() == before_entries
    assert again.usage() == before_usage
    assert before_usage.payload_bytes == sum(p.numel() for p in payloads.values())  # decoded, not stored
    assert {c for c, _ in before_entries} == set(payloads)
    for chunk_id, payload in payloads.items():
        got = get(again, chunk_id, payload.numel())
        assert got is not None and torch.equal(got, payload)


def test_reading_moves_a_chunk_to_the_end_and_the_order_survives_reopen(open_tier: OpenTier) -> None:
    tier = open_tier()
    for i in range(4):
        put(tier, [cid(i)], [bf16_bytes(64, i)])
    assert [c for c, _ in tier.entries()] == [cid(0), cid(1), cid(2), cid(3)]
    assert get(tier, cid(1), 64) is not None
    assert get(tier, cid(0), 64) is not None
    assert tier.read_into([cid(99)], [torch.zeros(64, dtype=torch.uint8)]) == [False]  # a miss moves nothing
    expected = [cid(2), cid(3), cid(1), cid(0)]
    assert [c for c, _ in tier.entries()] == expected
    tier.close()
    again = open_tier()
    assert [c for c, _ in again.entries()] == expected
    put(again, [cid(4)], [bf16_bytes(64, 4)])  # new sequence numbers continue after the stored ones
    assert get(again, cid(2), 64) is not None
    assert [c for c, _ in again.entries()] == [cid(3), cid(1), cid(0), cid(4), cid(2)]


_CRASH = """
import os, sys, torch
import tiercache.tiers.lmdb_order as order
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
order.ORDER_FLUSH_READS = 2
tier = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity_bytes=1 << 20))
ids = [bytes([i]) * 48 for i in range(4)]
for i, c in enumerate(ids):
    (slot,) = tier.reserve([c], [100])
    slot.buffer.fill_(i)
    tier.commit([slot])
for c in (ids[0], ids[1], ids[2]):  # the first two reads are flushed, the third is not
    assert tier.read_into([c], [torch.empty(100, dtype=torch.uint8)]) == [True]
print([c[0] for c, _ in tier.entries()], flush=True)
os._exit(0)  # no close: like a killed process
"""


def test_process_crash_keeps_commits_and_the_order_up_to_the_last_flush(
    open_tier: OpenTier, tmp_path: Path
) -> None:
    path = tmp_path / "crash"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", _CRASH, str(path)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.stdout.strip() == "[3, 0, 1, 2]"
    tier = open_tier(path=str(path), capacity_bytes=1 << 20)
    ids = [bytes([i]) * 48 for i in range(4)]
    # Commit sequence numbers land with the commit; the last read was never flushed.
    assert [c for c, _ in tier.entries()] == [ids[2], ids[3], ids[0], ids[1]]
    for i, chunk_id in enumerate(ids):
        got = get(tier, chunk_id, 100)
        assert got is not None and bool((got == i).all())


# -------------------------------------------------------------------------------------------- corruption


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("while_open", [False, True])
def test_flipped_payload_byte_is_a_counted_miss_and_deleted(
    open_tier: OpenTier, codec: Codec, while_open: bool
) -> None:
    tier = open_tier(codec=codec)
    victim, bystander = compressible_bytes(20_000, 1), compressible_bytes(20_000, 2)
    put(tier, [cid(0), cid(1)], [victim, bystander])
    stored = raw_value(tier.config, cid(0)) if not while_open else None
    if not while_open:
        assert stored is not None
        tier.close()
        tamper(tier.config, cid(0), "flip", HEADER_BYTES + (len(stored) - HEADER_BYTES) // 2)
        tier = open_tier(codec=codec)
        assert tier.contains([cid(0)]) == [True]  # payloads are only checked when read
    else:
        tamper(tier, cid(0), "flip", HEADER_BYTES + 5)
    assert get(tier, cid(0), victim.numel()) is None
    usage = tier.usage()
    assert usage.corrupt_reads == 1 and usage.chunks == 1
    assert tier.contains([cid(0), cid(1)]) == [False, True]
    assert [c for c, _ in tier.entries()] == [cid(1)]
    got = get(tier, cid(1), bystander.numel())
    assert got is not None and torch.equal(got, bystander)
    tier.close()
    assert raw_value(tier.config, cid(0)) is None  # gone from disk too


@pytest.mark.parametrize(
    ("op", "arg"),
    [
        ("truncate", 1),  # the last payload byte is lost
        ("truncate", 3000),
        ("extend", 4),  # trailing garbage
        ("short", 20),  # not even a whole header
        ("short", 0),  # empty value
        ("flip", 0),  # bad magic (header checksum fails too)
        ("flip", 9),  # raw length changed
        ("flip", 35),  # header checksum itself
        ("version", 2),  # well-formed header of an unknown format version
    ],
)
@pytest.mark.parametrize("while_open", [True, False])
def test_truncated_or_malformed_value_is_a_counted_miss_and_deleted(
    open_tier: OpenTier, op: str, arg: int, while_open: bool
) -> None:
    tier = open_tier()
    payload = bf16_bytes(4096)
    put(tier, [cid(0), cid(1)], [payload, bf16_bytes(4096, 1)])
    if while_open:
        tamper(tier, cid(0), op, arg)
    else:
        tier.close()
        tamper(tier.config, cid(0), op, arg)
        tier = open_tier()  # the open-time header scan drops it and counts it
    assert get(tier, cid(0), payload.numel()) is None
    usage = tier.usage()
    assert usage.corrupt_reads == 1
    assert usage.chunks == 1 and usage.used_bytes == HEADER_BYTES + 4096
    assert tier.contains([cid(0), cid(1)]) == [False, True]
    assert get(tier, cid(1), 4096) is not None
    tier.close()
    assert raw_value(tier.config, cid(0)) is None


def test_a_corrupt_chunk_can_be_stored_again(open_tier: OpenTier) -> None:
    tier = open_tier()
    put(tier, [cid(0)], [bf16_bytes(512)])
    tamper(tier, cid(0), "flip", HEADER_BYTES)
    assert get(tier, cid(0), 512) is None
    fresh = bf16_bytes(512, 9)
    put(tier, [cid(0)], [fresh])
    got = get(tier, cid(0), 512)
    assert got is not None and torch.equal(got, fresh)
    assert tier.usage().corrupt_reads == 1


# ---------------------------------------------------------------------------------------------- capacity


def test_charge_is_header_plus_payload(open_tier: OpenTier) -> None:
    tier = open_tier(capacity_bytes=10_000)
    assert tier.charge(1) == HEADER_BYTES + 1
    assert tier.charge(10_000 - HEADER_BYTES) == 10_000
    for bad in (0, -1, 10_000 - HEADER_BYTES + 1, True):
        with pytest.raises(InvalidArgumentError) as info:
            tier.charge(bad)
        assert info.value.field == "nbytes"


def test_reserve_beyond_capacity_reserves_nothing(open_tier: OpenTier) -> None:
    tier = open_tier(capacity_bytes=3 * (HEADER_BYTES + 1000))
    put(tier, [cid(0)], [random_bytes(1000)])
    with pytest.raises(CapacityError):
        tier.reserve([cid(1), cid(2), cid(3)], [1000, 1000, 1000])
    usage = tier.usage()
    assert usage.reserved_bytes == 0 and usage.chunks == 1
    slots = tier.reserve([cid(1), cid(2)], [1000, 1000])  # the same ids are still free to reserve
    assert tier.usage().free_bytes == 0
    with pytest.raises(CapacityError):
        tier.reserve([cid(3)], [1])
    tier.abort(slots)
    assert tier.usage().reserved_bytes == 0
    with pytest.raises(InvalidArgumentError) as info:  # can never fit, whatever is free
        tier.reserve([cid(3)], [3 * (HEADER_BYTES + 1000) - HEADER_BYTES + 1])
    assert info.value.field == "sizes"


def test_compression_frees_the_unused_charge(open_tier: OpenTier) -> None:
    tier = open_tier(capacity_bytes=2 * (HEADER_BYTES + 100_000), codec=Codec.ZSTD)
    slots = tier.reserve([cid(0), cid(1)], [100_000, 100_000])
    assert tier.usage().free_bytes == 0
    for slot in slots:
        slot.buffer.zero_()
    tier.commit(slots)
    usage = tier.usage()
    assert usage.reserved_bytes == 0 and usage.used_bytes < 2_000
    put(tier, [cid(2)], [random_bytes(100_000)])  # fits only because the first two were compressed


def test_usage_never_exceeds_capacity(open_tier: OpenTier) -> None:
    capacity = 50_000
    tier = open_tier(capacity_bytes=capacity, codec=Codec.ZSTD, zstd_level=1)
    rng = random.Random(7)
    live: list[Any] = []
    next_id = 0
    for step in range(300):
        op = rng.random()
        try:
            if op < 0.5:
                n = rng.randint(1, 3)
                sizes = [rng.randint(1, 8000) for _ in range(n)]
                slots = tier.reserve([cid(next_id + j) for j in range(n)], sizes)
                next_id += n
                for slot in slots:
                    slot.buffer.copy_((random_bytes if step % 2 else compressible_bytes)(slot.nbytes, step))
                live.extend(slots)
            elif op < 0.75 and live:
                batch = [live.pop(rng.randrange(len(live))) for _ in range(min(len(live), rng.randint(1, 2)))]
                tier.commit(batch)
            elif op < 0.85 and live:
                tier.abort([live.pop()])
            else:
                entries = tier.entries()
                if entries:
                    assert tier.delete([entries[0][0]]) == 1
        except CapacityError:
            pass
        usage = tier.usage()
        assert 0 <= usage.used_bytes + usage.reserved_bytes <= capacity
        assert usage.chunks == len(tier.entries())
    tier.abort(live)
    assert tier.usage().reserved_bytes == 0


def test_map_full_is_a_capacity_error_with_nothing_committed(open_tier: OpenTier) -> None:
    tier = open_tier(capacity_bytes=64 << 20, map_size_bytes=256 << 10)
    put(tier, [cid(0)], [random_bytes(4096)])
    slots = tier.reserve([cid(1), cid(2)], [100_000, 200_000])
    for slot in slots:
        slot.buffer.copy_(random_bytes(slot.nbytes, 3))
    before = tier.usage()
    with pytest.raises(CapacityError, match="map"):
        tier.commit(slots)
    assert tier.contains([cid(1), cid(2)]) == [False, False]
    assert tier.usage() == before  # the reservations stay live
    tier.abort(slots)
    assert tier.usage().reserved_bytes == 0
    put(tier, [cid(3)], [random_bytes(2048)])  # the environment still works
    tier.close()
    again = open_tier(capacity_bytes=64 << 20, map_size_bytes=256 << 10)
    assert sorted(c for c, _ in again.entries()) == sorted([cid(0), cid(3)])


def test_a_reserve_that_fails_part_way_leaves_no_reservation(
    open_tier: OpenTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = open_tier()
    real_take = StagingPool.take
    calls = [0]

    def take(self: StagingPool, nbytes: int) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 2:
            raise MemoryError("injected: no staging memory")
        return real_take(self, nbytes)

    monkeypatch.setattr(StagingPool, "take", take)
    with pytest.raises(MemoryError):
        tier.reserve([cid(0), cid(1)], [1000, 1000])
    assert tier.usage().reserved_bytes == 0
    monkeypatch.setattr(StagingPool, "take", real_take)
    put(tier, [cid(0), cid(1)], [random_bytes(1000), random_bytes(1000, 1)])  # neither id stayed reserved
    assert tier.contains([cid(0), cid(1)]) == [True, True]


# ------------------------------------------------------------------------------------------- bad input


def test_reserve_rejects_bad_input(open_tier: OpenTier) -> None:
    tier = open_tier()
    cases: list[tuple[list[Any], list[Any], str]] = [
        ([cid(0), cid(1)], [10], "sizes"),
        ([cid(0), cid(0)], [10, 10], "chunk_ids"),
        ([cid(0)], [0], "sizes"),
        ([cid(0)], [-5], "sizes"),
        ([cid(0)], [1.0], "sizes"),
        ([b""], [10], "chunk_ids"),
        ([b"x" * 512], [10], "chunk_ids"),
        (["a" * CHUNK_ID_BYTES], [10], "chunk_ids"),
    ]
    for ids, sizes, field in cases:
        with pytest.raises(InvalidArgumentError) as info:
            tier.reserve(ids, sizes)
        assert info.value.field == field, (ids, sizes)
    assert tier.usage().reserved_bytes == 0
    assert tier.reserve([], []) == []


def test_read_into_rejects_bad_destinations(open_tier: OpenTier) -> None:
    tier = open_tier()
    put(tier, [cid(0)], [random_bytes(100)])
    bad = [
        torch.zeros(99, dtype=torch.uint8),  # too small
        torch.zeros(100, dtype=torch.int8),
        torch.zeros(10, 10, dtype=torch.uint8),
    ]
    for dst in bad:
        with pytest.raises(InvalidArgumentError) as info:
            tier.read_into([cid(0)], [dst])
        assert info.value.field == "dsts"
    with pytest.raises(InvalidArgumentError) as info:
        tier.read_into([cid(0), cid(1)], [torch.zeros(100, dtype=torch.uint8)])
    assert info.value.field == "dsts"
    # A too-small destination for an absent chunk cannot be judged: it is a plain miss.
    assert tier.read_into([cid(5)], [torch.zeros(1, dtype=torch.uint8)]) == [False]


def test_slot_conflicts(open_tier: OpenTier) -> None:
    tier = open_tier()
    (slot,) = tier.reserve([cid(0)], [10])
    with pytest.raises(ConflictError):
        tier.reserve([cid(0)], [10])
    with pytest.raises(ConflictError):
        tier.commit([slot, slot])
    tier.commit([slot])
    assert tier.contains([cid(0)]) == [True]
    with pytest.raises(ConflictError):
        tier.commit([slot])
    with pytest.raises(ConflictError):
        tier.reserve([cid(0)], [10])
    tier.abort([slot])  # finished: ignored
    assert tier.usage().chunks == 1 and tier.usage().reserved_bytes == 0


def test_delete_counts_and_persists(open_tier: OpenTier) -> None:
    tier = open_tier()
    put(tier, [cid(i) for i in range(3)], [random_bytes(100, i) for i in range(3)])
    assert tier.delete([cid(0), cid(0), cid(9)]) == 1
    assert tier.delete([]) == 0
    assert tier.usage().used_bytes == 2 * (HEADER_BYTES + 100)
    tier.close()
    again = open_tier()
    assert [c for c, _ in again.entries()] == [cid(1), cid(2)]


def test_closed_tier_refuses_work(open_tier: OpenTier) -> None:
    tier = open_tier()
    put(tier, [cid(0)], [random_bytes(10)])
    pending = tier.reserve([cid(1)], [10])
    tier.close()
    for call in (
        lambda: tier.reserve([cid(2)], [10]),
        lambda: tier.commit(pending),
        lambda: tier.read_into([cid(0)], [torch.zeros(10, dtype=torch.uint8)]),
        lambda: tier.contains([cid(0)]),
        lambda: tier.delete([cid(0)]),
        lambda: tier.entries(),
        lambda: tier.flush(),
    ):
        with pytest.raises(ConflictError):
            call()
    assert tier.usage().reserved_bytes == 0
    tier.close()


# ------------------------------------------------------------------------------------------ concurrency


def test_concurrent_writers_readers_and_deleters(open_tier: OpenTier) -> None:
    tier = open_tier(codec=Codec.ZSTD, zstd_level=1)
    errors: list[BaseException] = []
    payloads: dict[bytes, torch.Tensor] = {}
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            for i in range(40):
                chunk_id = cid(w * 1000 + i)
                data = (compressible_bytes if i % 2 else bf16_bytes)(2 * (500 + 37 * i), i)
                put(tier, [chunk_id], [data])
                with lock:
                    payloads[chunk_id] = data
                got = get(tier, chunk_id, data.numel())
                assert got is None or torch.equal(got, data)  # None only if a deleter got there first
        except BaseException as exc:
            errors.append(exc)

    def deleter() -> None:
        try:
            for _ in range(60):
                entries = tier.entries()
                if len(entries) > 20:
                    tier.delete([c for c, _ in entries[:3]])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=deleter))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    entries = tier.entries()
    assert tier.usage().chunks == len(entries) and tier.usage().corrupt_reads == 0
    for chunk_id, nbytes in entries:
        got = get(tier, chunk_id, nbytes)
        assert got is not None and torch.equal(got, payloads[chunk_id])
    used = tier.usage().used_bytes
    tier.close()
    again = open_tier(codec=Codec.ZSTD, zstd_level=1)
    assert again.usage().used_bytes == used
    assert again.entries() == entries  # reading every entry in order leaves the order as it was


def test_a_damaged_environment_is_moved_aside_and_started_empty(tmp_path: Path) -> None:
    path = tmp_path / "l3"
    tier = LmdbTier(LmdbTierConfig(path=str(path), capacity_bytes=1 << 20))
    (slot,) = tier.reserve([b"d" * 48], [1000])
    slot.buffer.fill_(3)
    tier.commit([slot])
    tier.close()
    with open(path / "data.mdb", "r+b") as f:  # an OS crash tore the meta pages
        f.write(b"\xff" * 8192)
    with pytest.raises(InvalidArgumentError, match=r"path: LMDB environment .* is damaged"):
        LmdbTier(LmdbTierConfig(path=str(path), capacity_bytes=1 << 20, recover_damaged=False))
    tier = LmdbTier(LmdbTierConfig(path=str(path), capacity_bytes=1 << 20))
    try:
        assert tier.usage().chunks == 0
        assert [p.name.split("-")[0] for p in tmp_path.iterdir() if p.name != "l3"] == ["l3.damaged"]
        (slot,) = tier.reserve([b"d" * 48], [1000])
        slot.buffer.fill_(4)
        tier.commit([slot])
        assert tier.contains([b"d" * 48]) == [True]
    finally:
        tier.close()

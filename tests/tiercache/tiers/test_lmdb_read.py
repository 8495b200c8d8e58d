"""The L3 tier's batch read path: in one ``read_into``, a value that fails any check is a counted miss and
is deleted, and every other chunk of the batch is served bit-exactly into whatever destination it has.

Values are damaged from a separate process (LMDB forbids opening one environment twice in one process)
while the tier is open, so that the read path itself, not the open-time scan, must catch them.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tiercache.codec import Codec
from tiercache.keys import CHUNK_ID_BYTES
from tiercache.tiers.lmdb import LmdbTier, LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

BATCH = 8
VICTIM = 3

_DAMAGE = """
import sys, lmdb
path, victim, other, op, map_size = sys.argv[1:6]
env = lmdb.open(path, max_dbs=2, map_size=int(map_size))
db = env.open_db(b"values")
with env.begin(write=True, db=db) as txn:
    key = bytes.fromhex(victim)
    v = bytearray(txn.get(key))
    if op == "payload":
        v[len(v) - 7] ^= 0x5A
    elif op == "header":
        v[9] ^= 0x01
    elif op == "truncate":
        del v[-1:]
    elif op == "swap":  # a whole, well-formed value of another key
        v = bytearray(txn.get(bytes.fromhex(other)))
    else:
        raise SystemExit("unknown op " + op)
    txn.put(key, bytes(v))
env.close()
"""


def cid(i: int) -> bytes:
    """A well-formed chunk id."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=CHUNK_ID_BYTES).digest()


def payload(i: int, nbytes: int, codec: Codec) -> torch.Tensor:
    """Chunk ``i``'s bytes: random (stored raw), or a repeated pattern (stored compressed under zstd)."""
    if codec is Codec.ZSTD:
        return torch.arange(i, i + 16, dtype=torch.uint8).repeat(nbytes // 16)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))


def damage(tier: LmdbTier, victim: bytes, other: bytes, op: str) -> None:
    """Rewrite the stored value of ``victim`` from another process."""
    args = [tier.config.path, victim.hex(), other.hex(), op, str(tier.config.effective_map_size_bytes)]
    subprocess.run([sys.executable, "-c", _DAMAGE, *args], check=True, timeout=60)


@pytest.fixture
def tier(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LmdbTier]:
    """An open tier with the codec of the test's ``codec`` parameter (raw when it has none)."""
    codec = getattr(request, "param", Codec.RAW)
    opened = LmdbTier(LmdbTierConfig(path=str(tmp_path / "l3"), capacity_bytes=32 << 20, codec=codec))
    yield opened
    opened.close()


def fill(tier: LmdbTier, nbytes: int, codec: Codec) -> list[torch.Tensor]:
    """Commit chunks ``0..BATCH-1`` in one batch; returns their bytes."""
    chunks = [payload(i, nbytes, codec) for i in range(BATCH)]
    slots = tier.reserve([cid(i) for i in range(BATCH)], [c.numel() for c in chunks])
    for slot, chunk in zip(slots, chunks, strict=True):
        slot.buffer.copy_(chunk)
    tier.commit(slots)
    return chunks


@pytest.mark.parametrize("tier", list(Codec), indirect=True, ids=lambda c: c.value)
@pytest.mark.parametrize("op", ["payload", "header", "truncate", "swap"])
def test_a_damaged_value_in_a_batch_is_a_miss_and_the_others_are_exact(tier: LmdbTier, op: str) -> None:
    codec = tier.config.codec
    chunks = fill(tier, 64 << 10, codec)
    damage(tier, cid(VICTIM), cid(VICTIM + 1), op)
    ids = [cid(i) for i in range(BATCH)] + [cid(VICTIM), cid(99)]  # the victim twice, one absent id
    dsts = [torch.zeros(64 << 10, dtype=torch.uint8) for _ in ids]
    got = tier.read_into(ids, dsts)
    assert got == [i != VICTIM for i in range(BATCH)] + [False, False]
    for i in range(BATCH):
        if i != VICTIM:
            assert torch.equal(dsts[i], chunks[i]), f"chunk {i} differs"
    usage = tier.usage()
    assert usage.corrupt_reads == 1 and usage.chunks == BATCH - 1
    assert tier.contains([cid(VICTIM)]) == [False]
    assert tier.read_into([cid(VICTIM)], [torch.zeros(64 << 10, dtype=torch.uint8)]) == [False]
    assert tier.usage().corrupt_reads == 1  # deleted: a later read is a plain miss


def test_a_swapped_value_is_caught_by_its_record(tier: LmdbTier) -> None:
    # the value of another key passes every check of its own; only the per-chunk record tells
    chunks = fill(tier, 4096, Codec.RAW)
    damage(tier, cid(0), cid(1), "swap")
    dsts = [torch.zeros(4096, dtype=torch.uint8) for _ in range(2)]
    assert tier.read_into([cid(0), cid(1)], dsts) == [False, True]
    assert torch.equal(dsts[1], chunks[1])
    assert tier.usage().corrupt_reads == 1


@pytest.mark.parametrize("tier", list(Codec), indirect=True, ids=lambda c: c.value)
def test_one_batch_serves_every_kind_of_destination_exactly(tier: LmdbTier) -> None:
    nbytes = 8192
    chunks = fill(tier, nbytes, tier.config.codec)
    strided = torch.full((3 * nbytes,), 0xEE, dtype=torch.uint8)
    odd = torch.full((nbytes + 1,), 0xEE, dtype=torch.uint8)
    rows = torch.full((BATCH, nbytes), 0xEE, dtype=torch.uint8)
    dsts = [
        rows[0],  # a row of a larger tensor (what the bench and the connector pass)
        strided[::3],  # strided: the checksum is taken over the mapped bytes
        torch.full((nbytes + 100,), 0xEE, dtype=torch.uint8),  # longer than the chunk: the tail is kept
        odd[1:],  # a view at an odd offset
        *rows[4:].unbind(0),
    ]
    assert tier.read_into([cid(i) for i in range(BATCH)], dsts) == [True] * BATCH
    for i, dst in enumerate(dsts):
        assert torch.equal(dst[:nbytes], chunks[i]), f"destination {i} differs"
    assert bool((dsts[2][nbytes:] == 0xEE).all())
    assert tier.usage().corrupt_reads == 0


def test_stored_header_is_not_copied_into_the_destination(tier: LmdbTier) -> None:
    chunks = fill(tier, HEADER_BYTES * 3, Codec.RAW)
    dst = torch.zeros(HEADER_BYTES * 3, dtype=torch.uint8)
    assert tier.read_into([cid(5)], [dst]) == [True]
    assert torch.equal(dst, chunks[5])

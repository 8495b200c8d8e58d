"""Checked copies (:mod:`tiercache.checksum`): the blocked pass copies exactly and hashes what it copied.

The checksum of a copy must equal xxh3-64 of the bytes, whatever the size and block size (so values written
before the blocked pass still verify), and a single flipped bit anywhere, in particular at the edges of the
blocks, must change it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import xxhash

from tiercache.checksum import (
    BLOCK_BYTES,
    Hasher,
    checksum,
    copy_checksum,
    copy_checksum_tensor,
    gather_checksum,
)

BLOCK = 4096
"""A small block, so that tests cross many block edges cheaply."""

SIZES = (0, 1, 2, 7, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, 3 * BLOCK + 17, 10 * BLOCK - 1)


def data(nbytes: int, seed: int = 0) -> bytearray:
    gen = torch.Generator().manual_seed(seed)
    return bytearray(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen).numpy().tobytes())


@pytest.mark.parametrize("nbytes", SIZES)
@pytest.mark.parametrize("block", [1, 3, BLOCK, BLOCK_BYTES])
def test_copy_checksum_copies_exactly_and_equals_one_shot_xxh3(nbytes: int, block: int) -> None:
    src = data(nbytes, nbytes)
    dst = bytearray(b"\xaa" * (nbytes + 5))
    got = copy_checksum(memoryview(dst), src, block)
    assert got == xxhash.xxh3_64_intdigest(bytes(src)) == checksum(src)
    assert dst[:nbytes] == src
    assert dst[nbytes:] == b"\xaa" * 5  # nothing past the copy is touched


def _edges(nbytes: int) -> list[int]:
    """First and last byte, and both sides of every block edge."""
    out = {0, nbytes - 1}
    for edge in range(BLOCK, nbytes, BLOCK):
        out.update((edge - 1, edge))
    return sorted(out)


@pytest.mark.parametrize("nbytes", [1, BLOCK + 1, 3 * BLOCK + 17])
def test_a_flipped_bit_at_any_block_edge_changes_the_checksum(nbytes: int) -> None:
    src = data(nbytes, 1)
    good = copy_checksum(memoryview(bytearray(nbytes)), src, BLOCK)
    for offset in _edges(nbytes):
        for bit in (0, 7):
            flipped = bytearray(src)
            flipped[offset] ^= 1 << bit
            dst = bytearray(nbytes)
            assert copy_checksum(memoryview(dst), flipped, BLOCK) != good, (offset, bit)
            assert dst == flipped


def test_copy_checksum_refuses_a_short_destination_or_block() -> None:
    with pytest.raises(ValueError, match="dst"):
        copy_checksum(memoryview(bytearray(3)), b"abcd")
    with pytest.raises(ValueError, match="block_bytes"):
        copy_checksum(memoryview(bytearray(4)), b"abcd", 0)


def test_tensors_contiguous_or_strided_copy_and_hash_alike() -> None:
    src = torch.frombuffer(data(3 * BLOCK + 5, 2), dtype=torch.uint8)
    want = xxhash.xxh3_64_intdigest(src.numpy().tobytes())
    dst = torch.zeros(src.numel() + 3, dtype=torch.uint8)
    assert copy_checksum_tensor(dst, src, BLOCK) == want
    assert torch.equal(dst[: src.numel()], src) and not dst[src.numel() :].any()
    strided_dst = torch.zeros(2 * src.numel(), dtype=torch.uint8)[::2]
    assert copy_checksum_tensor(strided_dst, src, BLOCK) == want
    assert torch.equal(strided_dst, src)
    wide = torch.zeros(2 * src.numel(), dtype=torch.uint8)
    wide[::2] = src
    out = torch.zeros(src.numel(), dtype=torch.uint8)
    assert copy_checksum_tensor(out, wide[::2], BLOCK) == want
    assert torch.equal(out, src)


def test_a_hasher_fed_in_pieces_equals_the_whole() -> None:
    whole = data(5 * BLOCK + 3, 3)
    hasher = Hasher()
    dst = bytearray(len(whole))
    view = memoryview(dst)
    cuts = [0, 1, BLOCK, BLOCK + 1, 3 * BLOCK, len(whole)]
    for a, b in itertools.pairwise(cuts):
        hasher.copy_in(view[a:b], memoryview(whole)[a:b], BLOCK)
    assert hasher.intdigest() == checksum(whole)
    assert dst == whole


@pytest.mark.parametrize("block", [1, 3, BLOCK, BLOCK_BYTES])
def test_a_gather_copies_the_parts_in_order_and_hashes_the_whole(block: int) -> None:
    whole = np.frombuffer(bytes(data(6 * BLOCK + 11, 4)), dtype=np.uint8)
    # parts below, at and above a block
    cuts = [0, 0, 1, BLOCK - 1, 2 * BLOCK, 2 * BLOCK + 7, 5 * BLOCK, len(whole)]
    parts = [whole[a:b] for a, b in itertools.pairwise(cuts)]
    dst = np.zeros(len(whole) + 5, dtype=np.uint8)
    assert gather_checksum(dst, parts, block) == checksum(whole.tobytes())
    assert np.array_equal(dst[: len(whole)], whole) and not dst[len(whole) :].any()
    flipped = whole.copy()
    flipped[2 * BLOCK] ^= 1  # the first byte of a part
    assert gather_checksum(dst, [flipped[a:b] for a, b in itertools.pairwise(cuts)], block) != checksum(whole)


@pytest.mark.parametrize("block", [BLOCK, 4 * BLOCK, 4 * BLOCK + 1])
def test_a_gather_of_many_small_parts_lands_them_in_order(block: int) -> None:
    # a small layout's chunk: equal parts, several to a block, a group ending exactly at a block
    whole = np.frombuffer(bytes(data(8 * BLOCK, 5)), dtype=np.uint8)
    parts = [whole[i * BLOCK : (i + 1) * BLOCK] for i in range(8)]
    parts.insert(3, whole[:0])
    dst = np.zeros(len(whole), dtype=np.uint8)
    assert gather_checksum(dst, parts, block) == checksum(whole.tobytes())
    assert np.array_equal(dst, whole)
    flipped = [p.copy() for p in parts]
    flipped[-1][-1] ^= 1  # the last byte of the last group
    assert gather_checksum(dst, flipped, block) != checksum(whole.tobytes())


def test_a_gather_refuses_a_short_destination_or_block() -> None:
    parts = [np.ones(3, dtype=np.uint8), np.ones(2, dtype=np.uint8)]
    with pytest.raises(ValueError, match="dst"):
        gather_checksum(np.zeros(4, dtype=np.uint8), parts)
    with pytest.raises(ValueError, match="block_bytes"):
        gather_checksum(np.zeros(5, dtype=np.uint8), parts, 0)

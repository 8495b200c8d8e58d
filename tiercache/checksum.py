"""Checked copies: copy chunk bytes and take their checksum in one cache-blocked pass.

Every byte that enters or leaves a tier is checksummed (xxh3-64, the function the value format's version 1
names). Copying a chunk and then hashing the copy reads it from DRAM twice; here the copy goes block by
block (:data:`BLOCK_BYTES`, small enough that a block's source and destination stay in a core's cache), and
each block is fed to xxh3's streaming state while it is still in the cache, so the chunk crosses DRAM once.
The streaming digest equals the one-shot digest of the same bytes: the stored checksums do not change.

``tiercache-bench tiers`` prints the measured alternatives (memcpy, xxh3 and CRC32C alone, copy then hash,
copy and hash in blocks) as its ``checksum`` table; xxh3 was chosen by that measurement (CRC32C in
hardware is not faster per byte here, and would need a new value format version).

Primitives:
    BLOCK_BYTES: bytes per block of the blocked pass.
    ByteView: what the functions read: any contiguous byte buffer.
    checksum: the xxh3-64 checksum of bytes (the value format's raw and header checksums).
    copy_checksum: copy ``src`` into the front of ``dst`` and return the checksum of the bytes copied.
    copy_checksum_tensor: the same for 1-D ``uint8`` CPU tensors (contiguous or not).
    copy_checksum_array: the same for contiguous 1-D ``uint8`` arrays, without holding the interpreter lock.
    gather_checksum: copy byte arrays one after another into a byte array and return the checksum of the
        whole, without holding the interpreter lock while bytes move (two threads can each gather chunks).
    Hasher: a streaming checksum for bytes that arrive in pieces (a gather of many source tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xxhash

BLOCK_BYTES = 256 << 10
"""Bytes per block: the source and destination blocks (2 x 256 KiB) stay in a core's L2 cache between the
copy and the hash; ``tiercache-bench tiers``' checksum table compares block sizes."""

ByteView = bytes | bytearray | memoryview
"""What the functions read: any contiguous byte buffer."""


def checksum(data: ByteView) -> int:
    """The xxh3-64 checksum of ``data`` (one pass, no copy)."""
    return xxhash.xxh3_64_intdigest(data)


def copy_checksum(dst: memoryview, src: ByteView, block_bytes: int = BLOCK_BYTES) -> int:
    """Copy ``src`` into the front of ``dst`` and return the xxh3-64 checksum of the bytes copied.

    Block by block: each block is hashed right after it is copied, from the destination (the bytes that
    arrived, hot in the cache), so the checksum vouches for the copy, not only for its source.

    Args:
        dst: a writable, contiguous byte view at least ``len(src)`` long.
        src: the bytes to copy (contiguous).
        block_bytes: bytes per block (positive).

    Raises:
        ValueError: ``dst`` is shorter than ``src``, or ``block_bytes`` is not positive.
    """
    source = memoryview(src).cast("B")
    n = source.nbytes
    target = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
    if target.nbytes < n:
        raise ValueError(f"dst: {target.nbytes} bytes cannot hold {n}")
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be positive, got {block_bytes}")
    if n <= block_bytes:
        target[:n] = source
        return xxhash.xxh3_64_intdigest(target[:n])
    state = xxhash.xxh3_64()
    update = state.update
    for start in range(0, n, block_bytes):
        end = min(start + block_bytes, n)
        target[start:end] = source[start:end]
        update(target[start:end])
    return state.intdigest()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous 1-D ``uint8`` CPU tensor as a writable memoryview."""
    array: Any = tensor.numpy()  # ndarray exports the buffer protocol; its stubs do not say so
    return memoryview(array)


def copy_checksum_tensor(dst: torch.Tensor, src: torch.Tensor, block_bytes: int = BLOCK_BYTES) -> int:
    """Copy the 1-D ``uint8`` CPU tensor ``src`` into the front of ``dst`` (1-D ``uint8``, CPU) and return
    the xxh3-64 checksum of the bytes copied, in one blocked pass when both are contiguous
    (:func:`copy_checksum_array` on their arrays: no tensor op per call, which cost more than a tenth of a
    512 KiB chunk's copy).

    A non-contiguous source or destination is copied by torch and hashed afterwards (two passes; the
    checksum is then taken over ``dst`` when it is contiguous, else over ``src``).
    """
    if src.is_contiguous() and dst.is_contiguous():
        return copy_checksum_array(dst.numpy(), src.numpy(), block_bytes)
    out = dst[: src.numel()]
    out.copy_(src)
    hashed = out if out.is_contiguous() else src.contiguous()
    return xxhash.xxh3_64_intdigest(_bytes_of(hashed))


def copy_checksum_array(dst: np.ndarray, src: np.ndarray, block_bytes: int = BLOCK_BYTES) -> int:
    """Copy the contiguous 1-D ``uint8`` array ``src`` into the front of ``dst`` (the same) and return the
    xxh3-64 checksum of the bytes copied, block by block as in :func:`copy_checksum`; the copies release the
    interpreter lock (``numpy.copyto``), as the hash does.

    Raises:
        ValueError: ``dst`` is shorter than ``src``, or ``block_bytes`` is not positive.
    """
    return gather_checksum(dst, (src,), block_bytes)


def gather_checksum(dst: np.ndarray, parts: Sequence[np.ndarray], block_bytes: int = BLOCK_BYTES) -> int:
    """Copy the 1-D ``uint8`` arrays ``parts`` one after another into the front of the 1-D ``uint8`` array
    ``dst`` and return the xxh3-64 checksum of all the bytes copied, block by block as in
    :func:`copy_checksum` (each block hashed from ``dst`` right after it landed). Consecutive parts smaller
    than a block are gathered into one block by one call (``numpy.concatenate``) and hashed as one: a small
    layout's chunk is many small parts (a 512 KiB chunk of 4 layers: eight 64 KiB parts), and each call
    takes and gives back the interpreter lock.

    Both the copies and the hash release the interpreter lock, so two threads gathering different chunks run
    at once (:func:`copy_checksum`'s slice assignment holds the lock). With one call per part, two threads
    gathering 512 KiB chunks of 64 KiB parts ran no faster than one (each waiting for the lock after
    every part); with one call per 256 KiB block they copied at 0.95-1.07x a one-thread memcpy, against
    0.82-0.88x for one thread.

    Raises:
        ValueError: ``dst`` is shorter than the parts together, or ``block_bytes`` is not positive.
    """
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be positive, got {block_bytes}")
    copyto = np.copyto
    if len(parts) == 1 and parts[0].nbytes <= block_bytes:  # one block: one copy, one hash
        n = parts[0].nbytes
        if dst.nbytes < n:
            raise ValueError(f"dst: {dst.nbytes} bytes cannot hold {n}")
        block: Any = dst[:n]  # an ndarray exports the buffer protocol; its stubs do not say so
        copyto(block, parts[0])
        return xxhash.xxh3_64_intdigest(block)
    total = sum(part.nbytes for part in parts)
    if dst.nbytes < total:
        raise ValueError(f"dst: {dst.nbytes} bytes cannot hold {total}")
    state = xxhash.xxh3_64()
    update: Any = state.update  # (as above)
    offset = 0
    group: list[np.ndarray] = []  # consecutive small parts copied by one call, then hashed as one block
    group_start = group_bytes = 0
    for part in parts:
        n = part.nbytes
        if group and group_bytes + n > block_bytes:
            _land(dst, group, group_start, group_bytes, update)
            group = []
        if n <= block_bytes:
            if not group:
                group_start, group_bytes = offset, 0
            group.append(part)
            group_bytes += n
        else:
            for start in range(0, n, block_bytes):
                end = min(start + block_bytes, n)
                block = dst[offset + start : offset + end]
                copyto(block, part[start:end])
                update(block)
        offset += n
    if group:
        _land(dst, group, group_start, group_bytes, update)
    return int(state.intdigest())


def _land(dst: np.ndarray, group: list[np.ndarray], start: int, nbytes: int, update: Any) -> None:
    """Copy ``group`` one after another into ``dst`` from ``start`` with one call, then hash the block."""
    block: Any = dst[start : start + nbytes]
    if len(group) == 1:
        np.copyto(block, group[0])
    else:
        np.concatenate(group, out=block)
    update(block)


class Hasher:
    """A streaming xxh3-64 checksum of bytes that arrive in pieces: the digest of all pieces in order
    equals :func:`checksum` of their concatenation."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = xxhash.xxh3_64()

    def update(self, data: ByteView) -> None:
        """Add the next piece."""
        self._state.update(data)

    def copy_in(self, dst: memoryview, src: ByteView, block_bytes: int = BLOCK_BYTES) -> None:
        """Copy ``src`` into the front of ``dst`` block by block, adding each block as it lands."""
        source = memoryview(src).cast("B")
        target = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        n = source.nbytes
        if target.nbytes < n:
            raise ValueError(f"dst: {target.nbytes} bytes cannot hold {n}")
        for start in range(0, n, block_bytes):
            end = min(start + block_bytes, n)
            target[start:end] = source[start:end]
            self._state.update(target[start:end])

    def intdigest(self) -> int:
        """The checksum of every piece so far."""
        return int(self._state.intdigest())

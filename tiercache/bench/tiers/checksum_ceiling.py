"""The checksum table of ``tiercache-bench tiers``: what checked bytes cost next to a plain copy.

Every tier copies a chunk and checksums it (:mod:`tiercache.checksum`). Each round, on the run's payload (one
distinct source chunk after another, as a tier sees them), this measures a plain copy (memcpy: numpy
``copyto``), the hash alone (xxh3-64, and hardware CRC32C when the ``crc32c`` package is installed: the
bench extra installs it), a copy then a hash of the copy (two passes over DRAM), and the copy and hash in
one blocked pass at several block sizes (:func:`~tiercache.checksum.copy_checksum`, what the tiers do) and,
for the alternative checksum, the same blocked pass with CRC32C. Each figure is a ratio to the memcpy of its
own round; the report shows the median round's ratio and the range.

Primitives:
    ChecksumMethod: one way of moving or checking the bytes.
    ChecksumRow: one method at one chunk size over the rounds.
    measure_checksums: one round of every method on a payload: GB/s per method.
    checksum_rows: the rows of a chunk size from its rounds.
"""

from __future__ import annotations

import enum
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

import numpy as np
import torch

from tiercache.checksum import BLOCK_BYTES, checksum, copy_checksum


class ChecksumMethod(enum.Enum):
    """A way of moving or checking a chunk's bytes. The value is its name in the table."""

    MEMCPY = "memcpy"
    XXH3 = "xxh3-64 alone"
    CRC32C = "crc32c alone (hardware)"
    COPY_THEN_XXH3 = "copy, then xxh3"
    BLOCKED_64K = "copy+xxh3 in 64 KiB blocks"
    BLOCKED_128K = "copy+xxh3 in 128 KiB blocks"
    BLOCKED_256K = "copy+xxh3 in 256 KiB blocks"
    BLOCKED_1M = "copy+xxh3 in 1 MiB blocks"
    BLOCKED_CRC32C = "copy+crc32c in 256 KiB blocks"


_BLOCKS = {
    ChecksumMethod.BLOCKED_64K: 64 << 10,
    ChecksumMethod.BLOCKED_128K: 128 << 10,
    ChecksumMethod.BLOCKED_256K: 256 << 10,
    ChecksumMethod.BLOCKED_1M: 1 << 20,
}


@dataclass(frozen=True, slots=True)
class ChecksumRow:
    """One method at one chunk size over the rounds.

    Attributes:
        method: what was measured.
        chunk_bytes: bytes per chunk.
        gbps: the median round's GB/s.
        ratio: median over the rounds of GB/s / that round's memcpy GB/s.
        low / high: the lowest and highest round's ratio.
        in_use: whether the tiers use this method (the blocked pass at :data:`BLOCK_BYTES`).
    """

    method: ChecksumMethod
    chunk_bytes: int
    gbps: float
    ratio: float
    low: float
    high: float
    in_use: bool


_Crc = Callable[[memoryview, int], int]


def _crc32c() -> _Crc | None:
    """The ``crc32c`` package's hardware CRC32C (``crc(data, value)`` extends ``value`` by ``data``), or None
    when it is not installed."""
    try:
        module: Any = importlib.import_module("crc32c")
    except ImportError:
        return None
    fn: _Crc = module.crc32c
    return fn


def copy_crc32c(dst: memoryview, src: memoryview, block: int, crc: _Crc) -> int:
    """Copy ``src`` into the front of ``dst`` block by block, extending a CRC32C by each block as it lands:
    the CRC32C of ``src`` (the blocked pass of the tiers, with the alternative checksum)."""
    value = 0
    for start in range(0, len(src), block):
        end = min(start + block, len(src))
        dst[start:end] = src[start:end]
        value = crc(dst[start:end], value)
    return value


def _views(tensors: Sequence[torch.Tensor]) -> list[memoryview]:
    out = []
    for t in tensors:
        array: Any = t.numpy()  # ndarray exports the buffer protocol; its stubs do not say so
        out.append(memoryview(array))
    return out


def measure_checksums(
    srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor]
) -> dict[ChecksumMethod, float]:
    """One pass of every method over ``srcs`` (CPU 1-D ``uint8`` chunks) into ``dsts``: GB/s per method, in
    table order (the CRC32C rows only when its package is installed)."""
    src_v, dst_v = _views(srcs), _views(dsts)
    src_a = [t.numpy() for t in srcs]
    dst_a = [t.numpy() for t in dsts]
    total = sum(len(v) for v in src_v)
    crc = _crc32c()

    def memcpy() -> None:
        for s, d in zip(src_a, dst_a, strict=True):
            np.copyto(d, s)

    def xxh3() -> None:
        for s in src_v:
            checksum(s)

    def copy_then() -> None:
        for s, d, dv in zip(src_a, dst_a, dst_v, strict=True):
            np.copyto(d, s)
            checksum(dv)

    def blocked(block: int) -> Callable[[], None]:
        def run() -> None:
            for s, d in zip(src_v, dst_v, strict=True):
                copy_checksum(d, s, block)

        return run

    calls: dict[ChecksumMethod, Callable[[], None]] = {
        ChecksumMethod.MEMCPY: memcpy,
        ChecksumMethod.XXH3: xxh3,
    }
    if crc is not None:
        crc_fn = crc

        def crc32c() -> None:
            for s in src_v:
                crc_fn(s, 0)

        def copy_crc() -> None:
            for s, d in zip(src_v, dst_v, strict=True):
                copy_crc32c(d, s, BLOCK_BYTES, crc_fn)

        calls[ChecksumMethod.CRC32C] = crc32c
    calls[ChecksumMethod.COPY_THEN_XXH3] = copy_then
    for method, block in _BLOCKS.items():
        calls[method] = blocked(block)
    if crc is not None:
        calls[ChecksumMethod.BLOCKED_CRC32C] = copy_crc
    out = {}
    for method, call in calls.items():
        start = time.perf_counter()
        call()
        out[method] = total / max(time.perf_counter() - start, 1e-9) / 1e9
    return out


def checksum_rows(chunk_bytes: int, rounds: Sequence[dict[ChecksumMethod, float]]) -> list[ChecksumRow]:
    """The rows of one chunk size from its rounds (each round's figures against its own memcpy)."""
    rows = []
    for method in rounds[0]:
        gbps = [r[method] for r in rounds]
        ratios = [r[method] / r[ChecksumMethod.MEMCPY] for r in rounds]
        in_use = _BLOCKS.get(method) == BLOCK_BYTES
        rows.append(
            ChecksumRow(method, chunk_bytes, median(gbps), median(ratios), min(ratios), max(ratios), in_use)
        )
    return rows

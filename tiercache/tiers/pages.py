"""Pages of the L1 and L2 tiers: sizes, the checks of the bytes that go in and out, and utilisation.

A slot tier's pool is a row of fixed-size pages; a chunk takes a run of them (see
:mod:`tiercache.tiers.slots`). Pages smaller than the largest chunk let a mix of chunk sizes fill the pool;
the price is at most one partly used page per chunk. *Utilisation* is the chunks' own bytes over the
capacity: poor when the pages are much larger than the chunks (one 32 MiB slot per 2 MiB chunk uses 6 %).

Primitives:
    page_count: the pages of a pool, with its sizes checked.
    poor_utilisation: the once-per-tier warning of a full tier whose chunks use little of it.
    checksum_of: the xxh3-64 checksum of a chunk's bytes.
    check_dst: the check of a copy's destination.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import xxhash

from tiercache.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

POOR_UTILISATION = 0.5
"""Below this share of its capacity in chunk bytes, a full tier warns."""

FULL = 0.9
"""Share of a tier's pages in use from which it counts as full (for the utilisation warning)."""


def page_count(capacity_bytes: int, max_chunk_bytes: int, page_bytes: int) -> int:
    """Whole pages of ``page_bytes`` in ``capacity_bytes``; validates the sizes.

    Raises:
        InvalidArgumentError: a size is not a positive integer, a page is larger than the largest chunk, or
            the capacity does not hold one largest chunk.
    """
    for name, value in (
        ("capacity_bytes", capacity_bytes),
        ("slot_bytes", max_chunk_bytes),
        ("page_bytes", page_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidArgumentError(name, f"must be a positive integer, got {value!r}")
    if page_bytes > max_chunk_bytes:
        raise InvalidArgumentError(
            "page_bytes", f"{page_bytes} is larger than the largest chunk ({max_chunk_bytes} bytes)"
        )
    if capacity_bytes < max_chunk_bytes:
        raise InvalidArgumentError(
            "capacity_bytes", f"{capacity_bytes} is smaller than one slot of {max_chunk_bytes} bytes"
        )
    return capacity_bytes // page_bytes


def poor_utilisation(
    label: str, pages_in_use: int, num_pages: int, page_bytes: int, payload_bytes: int, chunks: int
) -> bool:
    """Log a warning and return True when a tier is full (``pages_in_use`` at least :data:`FULL` of its
    pages) while its chunks' bytes are under :data:`POOR_UTILISATION` of its capacity; False otherwise."""
    capacity = num_pages * page_bytes
    if pages_in_use < FULL * num_pages or payload_bytes >= POOR_UTILISATION * capacity:
        return False
    logger.warning(
        "%s is full but its chunks hold only %.0f%% of its %d bytes (chunks of %d bytes on average in "
        "pages of %d bytes): a smaller page size (page_bytes) would fit them",
        label,
        100.0 * payload_bytes / capacity,
        capacity,
        payload_bytes // max(1, chunks),
        page_bytes,
    )
    return True


def checksum_of(data: torch.Tensor) -> int:
    """The xxh3-64 checksum of a CPU ``uint8`` tensor's bytes (the same function L3 values carry)."""
    buffer: Any = data.numpy()  # numpy arrays export the buffer protocol; their stubs do not say so
    return xxhash.xxh3_64_intdigest(memoryview(buffer))


def check_dst(dst: torch.Tensor, nbytes: int) -> None:
    """Raise InvalidArgumentError unless ``dst`` is a 1-D uint8 tensor of at least ``nbytes`` bytes."""
    if not isinstance(dst, torch.Tensor) or dst.dtype != torch.uint8 or dst.dim() != 1:
        raise InvalidArgumentError("dsts", "each destination must be a 1-D uint8 tensor")
    if dst.numel() < nbytes:
        raise InvalidArgumentError(
            "dsts", f"destination of {dst.numel()} bytes is smaller than the chunk ({nbytes})"
        )

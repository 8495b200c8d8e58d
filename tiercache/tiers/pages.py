"""Pages of the L1 and L2 tiers: sizes, the checks of the bytes that go in and out, and utilisation.

A slot tier's pool is a row of fixed-size pages; a chunk takes a run of them (see
:mod:`tiercache.tiers.slots`). Pages smaller than the largest chunk let a mix of chunk sizes fill the pool;
the price is at most one partly used page per chunk. *Utilisation* is the chunks' own bytes over the
capacity: poor when the pages are much larger than the chunks (one 32 MiB slot per 2 MiB chunk uses 6 %).

Primitives:
    SLOT_BYTES, PAGE_BYTES: the slot and page size options, fields of both the L1 and the L2 config.
    DEFAULT_PAGE_BYTES: the page size a daemon runs with unless set, when it divides the slot size.
    page_count: the pages of a pool, with its sizes checked.
    poor_utilisation: the once-per-tier warning of a full tier whose chunks use little of it.
    checksum_of: the xxh3-64 checksum of a chunk's bytes.
    check_dst: the check of a copy's destination.
    Run, CommittedRun: where a chunk's pages are, and a committed chunk's record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from tiercache.checksum import checksum
from tiercache.errors import InvalidArgumentError
from tiercache.options import Computed, Option, Values
from tiercache.parsers import parse_size

logger = logging.getLogger(__name__)

POOR_UTILISATION = 0.5
"""Below this share of its capacity in chunk bytes, a full tier warns."""

FULL = 0.9
"""Share of a tier's pages in use from which it counts as full (for the utilisation warning)."""

DEFAULT_PAGE_BYTES = 64 << 10
"""The L1/L2 page size unless set, when it divides the slot size (else one page per slot): with pages of
64 KiB any mix of chunk sizes from 256 KiB up fills >= 94 % of the tiers (issue 13's measurement), where one
page per slot filled 2-38 % with chunks well under the slot size. A slot that is not a whole number of such
pages (a daemon sized to one exact chunk) keeps one page per slot, so that as many chunks fit as before."""


def _default_page_bytes(values: Values) -> int:
    slot = values.get_int("slot_bytes")
    return DEFAULT_PAGE_BYTES if slot > 0 and slot % DEFAULT_PAGE_BYTES == 0 else slot


SLOT_BYTES = Option(
    "slot_bytes",
    parse_size,
    "L1/L2 slot size: the largest chunk the daemon accepts",
    "SIZE",
    default=32 << 20,
)
PAGE_BYTES = Option(
    "page_bytes",
    parse_size,
    "L1/L2 page size, at most --slot-bytes (0: --slot-bytes, one page per chunk): a chunk takes as many "
    "whole pages as it needs, so pages well under the chunk size fill L1/L2 with any mix of chunk "
    "sizes; engines that predate pages refuse chunks longer than a page",
    "SIZE",
    default=0,
    computed=Computed(_default_page_bytes, "64K when it divides --slot-bytes, else --slot-bytes"),
)


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
    return checksum(memoryview(buffer))


def check_dst(dst: torch.Tensor, nbytes: int) -> None:
    """Raise InvalidArgumentError unless ``dst`` is a 1-D uint8 tensor of at least ``nbytes`` bytes."""
    if not isinstance(dst, torch.Tensor) or dst.dtype != torch.uint8 or dst.dim() != 1:
        raise InvalidArgumentError("dsts", "each destination must be a 1-D uint8 tensor")
    if dst.numel() < nbytes:
        raise InvalidArgumentError(
            "dsts", f"destination of {dst.numel()} bytes is smaller than the chunk ({nbytes})"
        )


Run = tuple[str, int]
"""A run of pages: (partition key, first page)."""


@dataclass(slots=True)
class CommittedRun:
    """A committed chunk: its run (``part``, first page ``slot``, ``pages``), its bytes and checksum."""

    part: str
    slot: int
    pages: int
    nbytes: int
    checksum: int | None = None

    @property
    def where(self) -> Run:
        """The run: (partition key, first page)."""
        return (self.part, self.slot)

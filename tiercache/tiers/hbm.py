"""L1: a pool of fixed-size pages in device memory (GPU HBM, or the CPU when there is no GPU).

The pool is one ``uint8`` tensor ``[num_pages, page_bytes]`` allocated once on ``device``; a chunk takes a run
of pages (:mod:`tiercache.tiers.slots`). On CUDA it is real HBM (same-host engines copy device-to-device); on
``cpu`` the same code runs so that tests cover it.

Primitives:
    HbmTierConfig: capacity, slot size and device (its fields declare the daemon's ``l1_*`` options).
    HbmTier: the L1 :class:`~tiercache.tiers.slots.SlotPoolTier`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tiercache.errors import InvalidArgumentError
from tiercache.options import internal, option
from tiercache.parsers import parse_size
from tiercache.tiers.base import TierLevel
from tiercache.tiers.pages import PAGE_BYTES, SLOT_BYTES, page_count
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HbmTierConfig:
    """Configuration of the L1 pool.

    Attributes:
        capacity_bytes: bytes of device memory for slots (rounded down to whole slots).
        slot_bytes: the largest chunk it can hold.
        device: torch device string, e.g. ``cuda:0`` or ``cpu`` (the daemon's ``--l1-device`` picks it).
        page_bytes: the unit of allocation, at most ``slot_bytes`` (0: ``slot_bytes``, one page per chunk);
            a chunk takes as many whole pages as its bytes need.
    """

    capacity_bytes: int = option(
        "l1_bytes", parse=parse_size, help="L1 (device memory) capacity", metavar="SIZE", default=2 << 30
    )
    slot_bytes: int = SLOT_BYTES.field()
    device: str = internal("cuda")
    page_bytes: int = PAGE_BYTES.field()

    @property
    def page_size(self) -> int:
        """The page size in bytes (``page_bytes``, or ``slot_bytes`` when that is 0)."""
        return self.page_bytes or self.slot_bytes


class HbmTier(SlotPoolTier):
    """The L1 tier: slots in one device tensor."""

    def __init__(self, config: HbmTierConfig) -> None:
        """Allocate the pool.

        Raises:
            InvalidArgumentError: bad sizes, or a device that does not exist here.
        """
        num_pages = page_count(config.capacity_bytes, config.slot_bytes, config.page_size)
        try:
            device = torch.device(config.device)
        except RuntimeError as exc:
            raise InvalidArgumentError("device", f"{config.device!r}: {exc}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgumentError("device", f"{config.device!r}: CUDA is not available on this host")
        pool = torch.empty((num_pages, config.page_size), dtype=torch.uint8, device=device)
        super().__init__(TierLevel.L1, pool, max_chunk_bytes=config.slot_bytes)
        logger.info("L1 pool: %d pages of %d bytes on %s", num_pages, config.page_size, device)

    def close(self) -> None:
        """Forget every chunk and release the device memory."""
        super().close()
        self._pool = self._pool.new_empty((0, self.page_bytes))

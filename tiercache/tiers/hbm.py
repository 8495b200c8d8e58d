"""L1: a pool of fixed-size chunk slots in device memory (GPU HBM, or the CPU when there is no GPU).

The pool is one ``uint8`` tensor ``[num_slots, slot_bytes]`` allocated once on ``device``. On CUDA it is real
HBM (same-host engines copy device-to-device); on ``cpu`` the same code runs so that tests cover it.

Primitives:
    HbmTierConfig: capacity, slot size and device.
    HbmTier: the L1 :class:`~tiercache.tiers.slots.SlotPoolTier`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.base import TierLevel
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


def slot_count(capacity_bytes: int, slot_bytes: int) -> int:
    """Whole slots that fit in ``capacity_bytes``; validates both sizes.

    Raises:
        InvalidArgumentError: a size is not a positive integer, or not even one slot fits.
    """
    for field, value in (("capacity_bytes", capacity_bytes), ("slot_bytes", slot_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidArgumentError(field, f"must be a positive integer, got {value!r}")
    if capacity_bytes < slot_bytes:
        raise InvalidArgumentError(
            "capacity_bytes", f"{capacity_bytes} is smaller than one slot of {slot_bytes} bytes"
        )
    return capacity_bytes // slot_bytes


@dataclass(frozen=True, slots=True)
class HbmTierConfig:
    """Configuration of the L1 pool.

    Attributes:
        capacity_bytes: bytes of device memory for slots (rounded down to whole slots).
        slot_bytes: bytes per slot (the largest chunk it can hold).
        device: torch device string, e.g. ``cuda:0`` or ``cpu``.
    """

    capacity_bytes: int
    slot_bytes: int
    device: str = "cuda"


class HbmTier(SlotPoolTier):
    """The L1 tier: slots in one device tensor."""

    def __init__(self, config: HbmTierConfig) -> None:
        """Allocate the pool.

        Raises:
            InvalidArgumentError: bad sizes, or a device that does not exist here.
        """
        num_slots = slot_count(config.capacity_bytes, config.slot_bytes)
        try:
            device = torch.device(config.device)
        except RuntimeError as exc:
            raise InvalidArgumentError("device", f"{config.device!r}: {exc}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgumentError("device", f"{config.device!r}: CUDA is not available on this host")
        pool = torch.empty((num_slots, config.slot_bytes), dtype=torch.uint8, device=device)
        super().__init__(TierLevel.L1, pool)
        logger.info("L1 pool: %d slots of %d bytes on %s", num_slots, config.slot_bytes, device)

    def close(self) -> None:
        """Forget every chunk and release the device memory."""
        super().close()
        self._pool = self._pool.new_empty((0, self.slot_bytes))

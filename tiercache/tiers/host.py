"""L2: a slab of fixed-size chunk slots in POSIX shared memory, pinned when CUDA is present.

The slab is one named segment (see :mod:`tiercache.shm`) that same-host engines map to copy KV straight
into or out of their own pages. At start the tier unlinks segments of the same prefix left by a dead owner;
at close it unlinks its own.

Primitives:
    HostTierConfig: capacity, slot size, segment prefix, pinning and pre-faulting.
    HostTier: the L2 :class:`~tiercache.tiers.slots.SlotPoolTier`; ``segment_name`` is what engines map.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from tiercache.shm import SharedSegment, clean_stale_segments
from tiercache.tiers.base import TierLevel
from tiercache.tiers.hbm import slot_count
from tiercache.tiers.slots import SlotPoolTier

logger = logging.getLogger(__name__)


def _cudart() -> Any:
    """The CUDA runtime bindings torch ships (cudaHostRegister / cudaHostUnregister)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """Configuration of the L2 slab.

    Attributes:
        capacity_bytes: bytes of shared memory for slots (rounded down to whole slots).
        slot_bytes: bytes per slot.
        segment_prefix: segment name prefix; one per daemon instance on a host.
        pin: register the slab as pinned memory when CUDA is available.
        prefault: populate every page at start (first touch of fresh shared memory is slow).
    """

    capacity_bytes: int
    slot_bytes: int
    segment_prefix: str = "tiercache-l2"
    pin: bool = True
    prefault: bool = True


class HostTier(SlotPoolTier):
    """The L2 tier: slots in a named shared-memory segment."""

    def __init__(self, config: HostTierConfig) -> None:
        """Clean stale segments, create the slab, pin it when CUDA is present.

        Raises:
            InvalidArgumentError: bad sizes or prefix.
            OSError: the system refused the segment.
        """
        num_slots = slot_count(config.capacity_bytes, config.slot_bytes)
        clean_stale_segments(config.segment_prefix)
        self._segment = SharedSegment.create(
            config.segment_prefix, num_slots * config.slot_bytes, prefault=config.prefault
        )
        self._pinned = False
        pool = torch.frombuffer(self._segment.buffer, dtype=torch.uint8).view(num_slots, config.slot_bytes)
        if config.pin and torch.cuda.is_available():
            err = _cudart().cudaHostRegister(pool.data_ptr(), pool.numel(), 0)
            self._pinned = int(err) == 0
            if not self._pinned:
                logger.warning(
                    "cudaHostRegister of %s failed (%s); L2 stays pageable", self.segment_name, err
                )
        super().__init__(TierLevel.L2, pool)

    @property
    def segment_name(self) -> str:
        """Name of the shared-memory segment engines attach to."""
        return self._segment.name

    @property
    def pinned(self) -> bool:
        """Whether the slab is registered as pinned (page-locked) memory."""
        return self._pinned

    def close(self) -> None:
        """Forget every chunk, unpin, unmap and unlink the segment (idempotent)."""
        super().close()
        if self._pinned:
            _cudart().cudaHostUnregister(self._pool.data_ptr())
            self._pinned = False
        self._pool = torch.empty((0, self.slot_bytes), dtype=torch.uint8)
        self._segment.unlink()
        self._segment.close()

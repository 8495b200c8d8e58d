"""L2: fixed-size chunk slots in POSIX shared memory, pinned when CUDA is present; one pool per tenant.

The default pool is one named segment (see :mod:`tiercache.shm`) that same-host engines of the default
tenant map to copy KV straight into or out of their own pages. At start the tier unlinks segments of the
same prefix left by a dead owner; at close it unlinks its own.

A namespace assigned to a tenant (:meth:`~tiercache.tiers.slots.SlotPoolTier.assign`) stores its chunks in
that tenant's own pool: an anonymous (memfd) segment with no name, made on the tenant's first assignment and
handed only to that tenant's engines as a file descriptor (:meth:`HostTier.segment_of`). Identical prefixes
of two tenants are two chunks in two pools. The pools share the tier's capacity
(:mod:`tiercache.tiers.slotspace`): a tenant pool is sparse, and its rows take pages that the other pools'
free rows give back, so the slots in use never exceed the capacity, whoever uses them. Tenant pools are
not pinned (pinning would fault in every page of each).

Every chunk is checksummed at commit (xxh3-64), and every copy out of L2 is checked against it.

Primitives:
    HostTierConfig: capacity, slot size, segment prefix, pinning and pre-faulting.
    HostTier: the L2 :class:`~tiercache.tiers.slots.SlotPoolTier`; ``segment_name`` is what default-tenant
        engines map, ``segment_of(tenant)`` the segment (name and file descriptor) of a tenant's pool.
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
from tiercache.tiers.slotspace import DEFAULT_PARTITION, PartitionBacking

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
        verify_loads: check each chunk's checksum before leasing it to an engine (off by default: on this
            host the check costs about half to all of the engine's own copy; see the README).
    """

    capacity_bytes: int
    slot_bytes: int
    segment_prefix: str = "tiercache-l2"
    pin: bool = True
    prefault: bool = True
    verify_loads: bool = False


class _TenantSegments(PartitionBacking):
    """The segments of a host tier's pools: the default named one, and one memfd per tenant."""

    def __init__(self, default: SharedSegment, label: str, slot_bytes: int) -> None:
        self.label = label
        self.slot_bytes = slot_bytes
        self.segments: dict[str, SharedSegment] = {DEFAULT_PARTITION: default}

    def create(self, key: str, num_slots: int, slot_bytes: int) -> torch.Tensor:
        seg = SharedSegment.create_anonymous(f"{self.label}.{len(self.segments)}", num_slots * slot_bytes)
        self.segments[key] = seg
        logger.info("L2 pool of tenant %r: %s", key, seg.name)
        return torch.frombuffer(seg.buffer, dtype=torch.uint8).view(num_slots, slot_bytes)

    def populate(self, key: str, row: int) -> None:
        self.segments[key].populate(row * self.slot_bytes, self.slot_bytes)

    def release(self, key: str, row: int) -> None:
        self.segments[key].release(row * self.slot_bytes, self.slot_bytes)


class HostTier(SlotPoolTier):
    """The L2 tier: slots in shared-memory segments (a named default pool, an anonymous one per tenant)."""

    shared = True

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
        label = self._segment.name.replace(config.segment_prefix, config.segment_prefix + "-tenant", 1)
        self._segments = _TenantSegments(self._segment, label, config.slot_bytes)
        super().__init__(
            TierLevel.L2, pool, checksums=True, backing=self._segments, verify_loads=config.verify_loads
        )

    @property
    def segment_name(self) -> str:
        """Name of the default pool's shared-memory segment (what engines of the default tenant attach to)."""
        return self._segment.name

    def segment_of(self, tenant: str) -> SharedSegment:
        """The segment of ``tenant``'s pool, made now if the tenant has none yet (the default pool's named
        segment for the default tenant; an anonymous one, to be handed out by its ``fd``, for the others)."""
        part = self.partition(tenant)
        return self._segments.segments[part]

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
        for segment in self._segments.segments.values():
            segment.close()

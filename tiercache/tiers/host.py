"""L2: chunks in runs of fixed-size pages of POSIX shared memory, pinned when CUDA is present; one pool per
tenant.

The default pool is one named segment (see :mod:`tiercache.shm`) that same-host engines of the default
tenant map to copy KV straight into or out of their own pages. At start the tier unlinks segments of the
same prefix left by a dead owner; at close it unlinks its own.

A namespace assigned to a tenant (:meth:`~tiercache.tiers.slots.SlotPoolTier.assign`) stores its chunks in
that tenant's own pool: an anonymous (memfd) segment with no name, made on the tenant's first assignment and
handed only to that tenant's engines as a file descriptor (:meth:`HostTier.segment_of`). Identical prefixes
of two tenants are two chunks in two pools. The pools share the tier's capacity
(:mod:`tiercache.tiers.slotspace`): a tenant pool is sparse, and its pages take memory that the other
pools' free pages give back, so the pages in use never exceed the capacity, whoever uses them. Tenant pools are
not pinned (pinning would fault in every page of each).

Every chunk is checksummed at commit (xxh3-64), and every copy out of L2 is checked against it.

Primitives:
    HostTierConfig: capacity, slot (largest chunk) and page sizes, segment prefix, pinning and pre-faulting
        (its fields declare the daemon's ``l2_*`` options).
    default_l2_bytes: the daemon's default capacity, from this host's RAM.
    HostTier: the L2 :class:`~tiercache.tiers.slots.SlotPoolTier`; ``segment_name`` is what default-tenant
        engines map, ``segment_of(tenant)`` the segment (name and file descriptor) of a tenant's pool.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from tiercache import pinning
from tiercache.options import Computed, Values, internal, option
from tiercache.parsers import parse_bool, parse_size, parse_str
from tiercache.shm import SharedSegment, clean_stale_segments
from tiercache.tiers.base import TierLevel
from tiercache.tiers.pages import PAGE_BYTES, SLOT_BYTES, page_count
from tiercache.tiers.slots import SlotPoolTier
from tiercache.tiers.slotspace import DEFAULT_PARTITION, PartitionBacking

logger = logging.getLogger(__name__)


def physical_ram_bytes() -> int:
    """Bytes of physical memory of this host."""
    return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))


def default_l2_bytes(slot_bytes: int) -> int:
    """10% of physical RAM rounded down to whole slots, at least one slot."""
    if slot_bytes <= 0:
        return 0
    return max(slot_bytes, physical_ram_bytes() // 10 // slot_bytes * slot_bytes)


def _l2_bytes(values: Values) -> int:
    return default_l2_bytes(values.get_int("slot_bytes"))


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """Configuration of the L2 slab.

    Attributes:
        capacity_bytes: bytes of shared memory for chunks (rounded down to whole pages).
        slot_bytes: the largest chunk.
        segment_prefix: segment name prefix; one per daemon instance on a host.
        pin: register the slab as pinned memory when CUDA is available.
        prefault: populate every page at start (first touch of fresh shared memory is slow).
        verify_loads: check each chunk's checksum before leasing it to an engine (off by default: on this
            host the check costs about half to all of the engine's own copy; see the README).
        page_bytes: the unit of allocation, at most ``slot_bytes`` (0: ``slot_bytes``, one page per chunk);
            a chunk takes as many whole pages as its bytes need. Engines find chunk bytes at
            ``slot * page_bytes`` (the segment's ``slot_bytes`` on the wire is the page size).
    """

    capacity_bytes: int = option(
        "l2_bytes",
        parse=parse_size,
        help="L2 (shared-memory) capacity",
        metavar="SIZE",
        computed=Computed(
            _l2_bytes, "10% of physical RAM in whole slots, at least one", on_host=True, example=16 << 30
        ),
    )
    slot_bytes: int = SLOT_BYTES.field()
    segment_prefix: str = option(
        "l2_prefix",
        parse=parse_str,
        help="name prefix of the L2 shared-memory segment under /dev/shm; one per daemon on a host",
        metavar="NAME",
        default="tiercache-l2",
    )
    pin: bool = internal(True)
    prefault: bool = internal(True)
    verify_loads: bool = option(
        "l2_verify_loads",
        parse=parse_bool,
        help="check each L2 chunk's checksum before leasing it to an engine (off: it costs more than a tenth "
        "of a load here)",
        default=False,
    )
    page_bytes: int = PAGE_BYTES.field()

    @property
    def page_size(self) -> int:
        """The page size in bytes (``page_bytes``, or ``slot_bytes`` when that is 0)."""
        return self.page_bytes or self.slot_bytes


class _TenantSegments(PartitionBacking):
    """The segments of a host tier's pools: the default named one, and one memfd per tenant."""

    def __init__(self, default: SharedSegment, label: str, page_bytes: int) -> None:
        self.label = label
        self.page_bytes = page_bytes
        self.segments: dict[str, SharedSegment] = {DEFAULT_PARTITION: default}

    def create(self, key: str, num_pages: int, page_bytes: int) -> torch.Tensor:
        seg = SharedSegment.create_anonymous(f"{self.label}.{len(self.segments)}", num_pages * page_bytes)
        self.segments[key] = seg
        logger.info("L2 pool of tenant %r: %s", key, seg.name)
        return torch.frombuffer(seg.buffer, dtype=torch.uint8).view(num_pages, page_bytes)

    def populate(self, key: str, start: int, count: int) -> None:
        self.segments[key].populate(start * self.page_bytes, count * self.page_bytes)

    def release(self, key: str, start: int, count: int) -> None:
        self.segments[key].release(start * self.page_bytes, count * self.page_bytes)


class HostTier(SlotPoolTier):
    """The L2 tier: slots in shared-memory segments (a named default pool, an anonymous one per tenant)."""

    shared = True

    def __init__(self, config: HostTierConfig) -> None:
        """Clean stale segments, create the slab, pin it when CUDA is present.

        Raises:
            InvalidArgumentError: bad sizes or prefix.
            OSError: the system refused the segment.
        """
        page = config.page_size
        num_pages = page_count(config.capacity_bytes, config.slot_bytes, page)
        clean_stale_segments(config.segment_prefix)
        self._segment = SharedSegment.create(
            config.segment_prefix, num_pages * page, prefault=config.prefault
        )
        pool = torch.frombuffer(self._segment.buffer, dtype=torch.uint8).view(num_pages, page)
        self._pinned = config.pin and pinning.pin(pool, self._segment.name)
        label = self._segment.name.replace(config.segment_prefix, config.segment_prefix + "-tenant", 1)
        self._segments = _TenantSegments(self._segment, label, page)
        super().__init__(
            TierLevel.L2,
            pool,
            checksums=True,
            backing=self._segments,
            verify_loads=config.verify_loads,
            max_chunk_bytes=config.slot_bytes,
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
            pinning.unpin(self._pool, self.segment_name)
            self._pinned = False
        self._pool = torch.empty((0, self.page_bytes), dtype=torch.uint8)
        self._segment.unlink()
        for segment in self._segments.segments.values():
            segment.close()

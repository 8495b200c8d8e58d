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

Each pool's segment holds, after its pages, the pool's published index (:mod:`tiercache.tiers.published`):
a chunk is published when committed and withdrawn before its pages are freed, and a thread writes every
index's heartbeat, so that engines find the pool's chunks with no call while the daemon lives.

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
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiercache import pinning
from tiercache.keys import CHUNK_ID_BYTES, NAMESPACE_ID_BYTES
from tiercache.options import Computed, Values, internal, option
from tiercache.parsers import parse_bool, parse_size, parse_str
from tiercache.shm import SharedSegment, clean_stale_segments
from tiercache.tiers.base import TierLevel, WriteSlot
from tiercache.tiers.pages import PAGE_BYTES, SLOT_BYTES, Run, page_count
from tiercache.tiers.published import BEAT_S, IndexWriter, index_bytes, index_entries
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
    """The segments of a host tier's pools: the default named one, and one memfd per tenant; each holds its
    pool's pages, then the pool's published index (:mod:`tiercache.tiers.published`)."""

    def __init__(self, default: SharedSegment, label: str, page_bytes: int, entries: int) -> None:
        self.label = label
        self.page_bytes = page_bytes
        self.entries = entries
        self.segments: dict[str, SharedSegment] = {}
        self.indexes: dict[str, IndexWriter] = {}
        self._add(DEFAULT_PARTITION, default)

    def _add(self, key: str, segment: SharedSegment) -> None:
        self.segments[key] = segment
        pool_bytes = segment.size - index_bytes(self.entries)
        self.indexes[key] = IndexWriter(segment.buffer[pool_bytes:], self.entries)

    def create(self, key: str, num_pages: int, page_bytes: int) -> torch.Tensor:
        size = num_pages * page_bytes
        seg = SharedSegment.create_anonymous(
            f"{self.label}.{len(self.segments)}", size + index_bytes(self.entries)
        )
        self._add(key, seg)
        logger.info("L2 pool of tenant %r: %s", key, seg.name)
        return torch.frombuffer(seg.buffer[:size], dtype=torch.uint8).view(num_pages, page_bytes)

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
        self.index_entries = index_entries(num_pages)
        self._segment = SharedSegment.create(
            config.segment_prefix,
            num_pages * page + index_bytes(self.index_entries),
            prefault=config.prefault,
        )
        pool = torch.frombuffer(self._segment.buffer[: num_pages * page], dtype=torch.uint8).view(
            num_pages, page
        )
        self._pinned = config.pin and pinning.pin(pool, self._segment.name)
        label = self._segment.name.replace(config.segment_prefix, config.segment_prefix + "-tenant", 1)
        self._segments = _TenantSegments(self._segment, label, page, self.index_entries)
        super().__init__(
            TierLevel.L2,
            pool,
            checksums=True,
            backing=self._segments,
            verify_loads=config.verify_loads,
            max_chunk_bytes=config.slot_bytes,
        )
        self._closing = threading.Event()
        self._beats = threading.Thread(target=self._beat, name="tiercache-l2-beat", daemon=True)
        self._beats.start()

    def _beat(self) -> None:
        """Write every pool index's heartbeat each :data:`~.published.BEAT_S` until the tier closes."""
        while not self._closing.wait(BEAT_S):
            with self._lock:
                for index in self._segments.indexes.values():
                    index.beat()

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
    def segment_bytes(self) -> int:
        """Bytes of each pool's segment: its pages, then its published index."""
        return self.num_pages * self.page_bytes + index_bytes(self.index_entries)

    def _commit(self, slots: Sequence[WriteSlot], wheres: list[Run], checks: Sequence[int | None]) -> None:
        """Commit, then publish each chunk in its pool's index where it is now (a chunk dropped meanwhile is
        not; a chunk an index has no room for is left to the engines' calls)."""
        super()._commit(slots, wheres, checks)
        with self._lock:
            for ws in slots:
                entry = self._committed.get(ws.chunk_id)
                if entry is not None and len(ws.chunk_id) == CHUNK_ID_BYTES:
                    key = ws.chunk_id[NAMESPACE_ID_BYTES:]
                    self._segments.indexes[entry.part].publish(key, entry.slot, entry.nbytes)

    def _delete_entry(self, cid: bytes) -> bool:
        """Drop a committed chunk (under the lock), withdrawn from its pool's index before its pages are
        freed."""
        entry = self._committed.get(cid)
        if entry is not None and len(cid) == CHUNK_ID_BYTES:
            self._segments.indexes[entry.part].withdraw(cid[NAMESPACE_ID_BYTES:])
        return super()._delete_entry(cid)

    @property
    def pinned(self) -> bool:
        """Whether the slab is registered as pinned (page-locked) memory."""
        return self._pinned

    def close(self) -> None:
        """Withdraw every published chunk, forget every chunk, unpin, unmap and unlink the segment
        (idempotent)."""
        self._closing.set()
        self._beats.join()
        with self._lock:
            for index in self._segments.indexes.values():
                index.close()
        super().close()
        if self._pinned:
            pinning.unpin(self._pool, self.segment_name)
            self._pinned = False
        self._pool = torch.empty((0, self.page_bytes), dtype=torch.uint8)
        self._segment.unlink()
        for segment in self._segments.segments.values():
            segment.close()

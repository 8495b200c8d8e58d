"""What the client's calls return: frozen, typed mirrors of the daemon's responses.

Primitives:
    Tier: the cache tiers as the wire numbers them.
    DataPlaneInfo: the daemon's shared-memory segment (same-host data plane).
    Registration: handle, accepted layout and limits of a registered namespace.
    LookupInfo, SlotRef, StoreTicket, LoadLease, StreamStoreResult, StreamChunk: per-call results.
    TierStatsInfo, DaemonStats: a stats snapshot.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tiercache.layout import KVLayout
from tiercache.proto import tiercache_pb2 as pb

from .wire import layout_from_proto


class Tier(enum.IntEnum):
    """Cache tiers, numbered as on the wire."""

    L1 = 1
    L2 = 2
    L3 = 3


def _tier(value: int) -> Tier | None:
    try:
        return Tier(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class DataPlaneInfo:
    """The daemon's shared-memory tier: slot ``i`` is bytes ``[i * slot_bytes, i * slot_bytes + nbytes)``.

    Attributes:
        shm_segment: segment name under ``/dev/shm``.
        slot_bytes: bytes per slot.
        num_slots: slots in the segment.
        segment_bytes: size of the segment.
    """

    shm_segment: str
    slot_bytes: int
    num_slots: int
    segment_bytes: int


@dataclass(frozen=True, slots=True)
class Registration:
    """A namespace registered with the daemon.

    Attributes:
        handle: opaque handle every other call takes (deterministic: the same after a daemon restart).
        layout: the layout the daemon accepted.
        chunk_bytes: bytes of one chunk.
        data_plane: the shared-memory segment, or None when the daemon has no shared-memory tier.
        lease_ttl_s: default lifetime of a load lease or store ticket.
        max_stream_message_bytes: largest byte-stream message the daemon accepts or sends.
    """

    handle: bytes
    layout: KVLayout
    chunk_bytes: int
    data_plane: DataPlaneInfo | None
    lease_ttl_s: float
    max_stream_message_bytes: int

    @classmethod
    def from_proto(cls, msg: pb.RegisterResponse) -> Registration:
        """Convert a ``RegisterResponse``.

        Raises:
            InvalidArgumentError: the daemon answered with an invalid layout.
        """
        plane = None
        if msg.HasField("data_plane") and msg.data_plane.shm_segment:
            dp = msg.data_plane
            plane = DataPlaneInfo(dp.shm_segment, dp.slot_bytes, dp.num_slots, dp.segment_bytes)
        return cls(
            handle=bytes(msg.handle),
            layout=layout_from_proto(msg.layout),
            chunk_bytes=msg.chunk_bytes,
            data_plane=plane,
            lease_ttl_s=msg.lease_ttl_s,
            max_stream_message_bytes=msg.max_stream_message_bytes,
        )


@dataclass(frozen=True, slots=True)
class LookupInfo:
    """How much of a key chain is cached.

    Attributes:
        chunks: contiguous prefix cached in any tier.
        by_tier: per tier, the contiguous prefix cached in that tier.
    """

    chunks: int
    by_tier: Mapping[Tier, int]

    @classmethod
    def from_proto(cls, msg: pb.LookupResponse) -> LookupInfo:
        """Convert a ``LookupResponse``."""
        by_tier = {t: c.chunks for c in msg.by_tier if (t := _tier(c.tier)) is not None}
        return cls(chunks=msg.chunks, by_tier=MappingProxyType(by_tier))


@dataclass(frozen=True, slots=True)
class SlotRef:
    """A shared-memory slot holding (or to receive) one chunk.

    Attributes:
        index: position of the chunk in the request's keys.
        slot: slot number in the segment.
        nbytes: bytes of the chunk in the slot.
    """

    index: int
    slot: int
    nbytes: int


def _slots(refs: Iterable[pb.SlotRef]) -> tuple[SlotRef, ...]:
    return tuple(SlotRef(r.index, r.slot, r.nbytes) for r in refs)


@dataclass(frozen=True, slots=True)
class StoreTicket:
    """Reserved shared-memory slots for a store, to be filled then committed or aborted.

    Attributes:
        ticket_id: pass it to ``commit_store`` / ``abort_store``.
        slots: the slots to fill, by chunk position.
        skipped: positions not reserved (already cached, or being stored by someone else).
        expires_in_s: the reservation lapses after this many seconds.
    """

    ticket_id: int
    slots: tuple[SlotRef, ...]
    skipped: tuple[int, ...]
    expires_in_s: float

    @classmethod
    def from_proto(cls, msg: pb.BeginStoreResponse) -> StoreTicket:
        """Convert a ``BeginStoreResponse``."""
        return cls(msg.ticket_id, _slots(msg.slots), tuple(msg.skipped), msg.expires_in_s)


@dataclass(frozen=True, slots=True)
class LoadLease:
    """Leased shared-memory slots holding the cached prefix of a chain.

    Attributes:
        lease_id: pass it to ``release_load``; 0 when nothing is leased.
        slots: the slots of the contiguous cached prefix, by chunk position.
        expires_in_s: the lease lapses after this many seconds.
    """

    lease_id: int
    slots: tuple[SlotRef, ...]
    expires_in_s: float

    @classmethod
    def from_proto(cls, msg: pb.AcquireLoadResponse) -> LoadLease:
        """Convert an ``AcquireLoadResponse``."""
        return cls(msg.lease_id, _slots(msg.slots), msg.expires_in_s)


@dataclass(frozen=True, slots=True)
class StreamStoreResult:
    """Outcome of a byte-stream store.

    Attributes:
        stored: chunks the daemon added.
        skipped: positions it did not store (already cached or being stored).
    """

    stored: int
    skipped: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One whole chunk received over the byte stream.

    Attributes:
        index: position in the request's keys.
        key: the chunk key.
        data: the raw (decompressed) chunk bytes, ``chunk_bytes`` long.
    """

    index: int
    key: bytes
    data: bytearray


@dataclass(frozen=True, slots=True)
class TierStatsInfo:
    """Counters and usage of one tier."""

    tier: Tier | None
    chunks: int
    used_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evictions: int
    promotions: int
    demotions: int
    corrupt_reads: int


@dataclass(frozen=True, slots=True)
class DaemonStats:
    """A snapshot of the daemon's cache.

    Attributes:
        tiers: per-tier counters.
        namespaces: registered namespaces.
        active_leases: live load leases.
        expired_leases: leases and tickets reclaimed at their TTL so far.
        single_flight_joins: reads that joined an in-flight read.
        pending_writes: queued write-downs.
        failed_writes: write-downs that failed.
    """

    tiers: tuple[TierStatsInfo, ...]
    namespaces: int
    active_leases: int
    expired_leases: int
    single_flight_joins: int
    pending_writes: int
    failed_writes: int

    @classmethod
    def from_proto(cls, msg: pb.StatsResponse) -> DaemonStats:
        """Convert a ``StatsResponse``."""
        tiers = tuple(
            TierStatsInfo(
                tier=_tier(t.tier),
                chunks=t.chunks,
                used_bytes=t.used_bytes,
                capacity_bytes=t.capacity_bytes,
                hits=t.hits,
                misses=t.misses,
                evictions=t.evictions,
                promotions=t.promotions,
                demotions=t.demotions,
                corrupt_reads=t.corrupt_reads,
            )
            for t in msg.tiers
        )
        return cls(
            tiers=tiers,
            namespaces=msg.namespaces,
            active_leases=msg.active_leases,
            expired_leases=msg.expired_leases,
            single_flight_joins=msg.single_flight_joins,
            pending_writes=msg.pending_writes,
            failed_writes=msg.failed_writes,
        )

    def tier(self, tier: Tier) -> TierStatsInfo | None:
        """The counters of ``tier``, or None when the daemon has no such tier."""
        return next((t for t in self.tiers if t.tier == tier), None)

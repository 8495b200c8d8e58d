"""What the client's calls return: frozen, typed mirrors of the daemon's responses.

Primitives:
    SegmentInfo: the daemon's shared-memory segment (what the same-host data plane maps).
    Registration: handle, accepted layout and limits of a registered namespace.
    LookupInfo, PrefetchInfo, SlotRef, StoreGrant, LoadLease, StreamStoreResult, StreamChunk: per-call
        results.
    PrefillClaimInfo: what a single-flight prefill claim granted.

A stats snapshot is the core's :class:`~tiercache.stats.CacheStats` (see :mod:`tiercache.wire.stats`). Tiers
and layouts convert through :mod:`tiercache.wire`; a tier this side does not know reads as None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tiercache.layout import KVLayout
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import TIERS, layout_from_proto


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """The daemon's shared-memory tier: slot ``i`` is bytes ``[i * slot_bytes, i * slot_bytes + nbytes)``.

    Attributes:
        shm_segment: segment name under ``/dev/shm`` (or, with ``fd_socket``, the name of the tenant's
            anonymous pool: an identity only, nothing to open).
        slot_bytes: bytes per slot.
        num_slots: slots in the segment.
        segment_bytes: size of the segment.
        fd_socket: the daemon's fd socket, where the segment's descriptor is handed out (isolated data
            plane); empty: map ``shm_segment`` by name.
        fd_grant: the one-time grant to present there.
        max_chunk_bytes: the largest chunk, from its first slot over the next ones (a daemon with pages:
            ``slot_bytes`` is the page size); 0: a chunk fits in one slot.
        index_entries: entries of the pool's published index (:mod:`tiercache.tiers.published`), right
            after its slots; 0: the daemon publishes none.
    """

    shm_segment: str
    slot_bytes: int
    num_slots: int
    segment_bytes: int
    fd_socket: str = ""
    fd_grant: bytes = b""
    max_chunk_bytes: int = 0
    index_entries: int = 0


@dataclass(frozen=True, slots=True)
class Registration:
    """A namespace registered with the daemon.

    Attributes:
        handle: opaque handle every other call takes (deterministic: the same after a daemon restart).
        layout: the layout the daemon accepted.
        chunk_bytes: bytes of one chunk.
        segment: the shared-memory segment, or None when the daemon has no shared-memory tier.
        lease_ttl_s: default lifetime of a load lease or store ticket.
        max_stream_message_bytes: largest byte-stream message the daemon accepts or sends.
        control_socket: where the daemon also serves the unary calls without gRPC ("": nowhere).
        packed_keys: the daemon reads a Lookup's keys packed into one field (False: an older daemon, which
            reads only the repeated keys).
    """

    handle: bytes
    layout: KVLayout
    chunk_bytes: int
    segment: SegmentInfo | None
    lease_ttl_s: float
    max_stream_message_bytes: int
    control_socket: str = ""
    packed_keys: bool = False

    @classmethod
    def from_proto(cls, msg: pb.RegisterResponse) -> Registration:
        """Convert a ``RegisterResponse``.

        Raises:
            InvalidArgumentError: the daemon answered with an invalid layout.
        """
        segment = None
        if msg.HasField("data_plane") and msg.data_plane.shm_segment:
            dp = msg.data_plane
            segment = SegmentInfo(
                dp.shm_segment,
                dp.slot_bytes,
                dp.num_slots,
                dp.segment_bytes,
                dp.fd_socket,
                bytes(dp.fd_grant),
                dp.max_chunk_bytes,
                dp.index_entries,
            )
        return cls(
            handle=bytes(msg.handle),
            layout=layout_from_proto(msg.layout),
            chunk_bytes=msg.chunk_bytes,
            segment=segment,
            lease_ttl_s=msg.lease_ttl_s,
            max_stream_message_bytes=msg.max_stream_message_bytes,
            control_socket=msg.control_socket,
            packed_keys=msg.packed_keys,
        )


@dataclass(frozen=True, slots=True)
class LookupInfo:
    """How much of a key chain is cached.

    Attributes:
        chunks: contiguous prefix cached in any tier.
        by_tier: per tier, the contiguous prefix cached in that tier.
        prefetch_id: with ``prefetch``: the id of the promotions started (0: none running).
    """

    chunks: int
    by_tier: Mapping[TierLevel, int]
    prefetch_id: int = 0

    @classmethod
    def from_proto(cls, msg: pb.LookupResponse) -> LookupInfo:
        """Convert a ``LookupResponse``."""
        by_tier = {t: c.chunks for c in msg.by_tier if (t := TIERS.lookup(c.tier)) is not None}
        return cls(chunks=msg.chunks, by_tier=MappingProxyType(by_tier), prefetch_id=msg.prefetch_id)


@dataclass(frozen=True, slots=True)
class PrefetchInfo:
    """How far a prefetch got.

    Attributes:
        ready: contiguous chunks in shared memory when the call returned.
        prefetch_id: promotions still running (cancel them with ``cancel_prefetch``); 0 when none are.
    """

    ready: int
    prefetch_id: int


@dataclass(frozen=True, slots=True)
class SlotRef:
    """A shared-memory slot holding (or to receive) one chunk.

    Attributes:
        index: position of the chunk in the request's keys.
        slot: slot number in the segment.
        nbytes: bytes of the chunk in the slot.
        source: loads: the fastest tier that held the chunk when the load asked for it (else None).
    """

    index: int
    slot: int
    nbytes: int
    source: TierLevel | None = None


def _slots(refs: Iterable[pb.SlotRef]) -> tuple[SlotRef, ...]:
    return tuple(SlotRef(r.index, r.slot, r.nbytes, TIERS.lookup(r.source)) for r in refs)


@dataclass(frozen=True, slots=True)
class StoreGrant:
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
    def from_proto(cls, msg: pb.BeginStoreResponse) -> StoreGrant:
        """Convert a ``BeginStoreResponse``."""
        return cls(msg.ticket_id, _slots(msg.slots), tuple(msg.skipped), msg.expires_in_s)


@dataclass(frozen=True, slots=True)
class LoadLease:
    """Leased shared-memory slots holding the cached prefix of a chain.

    Attributes:
        lease_id: pass it to ``release_load``; 0 when nothing is leased.
        slots: the slots of the leased prefix, by chunk position (with their source tier).
        expires_in_s: the lease lapses after this many seconds.
        cached: contiguous chunks cached in any tier (the slots may be fewer: policy, deadline, room).
        estimated_load_s: cost-aware loads: estimated time to load the chosen prefix.
        estimated_recompute_s: cost-aware loads: estimated time to recompute it instead.
        more: the leases of the further chains asked in the same call (``more_chains``), in order.
    """

    lease_id: int
    slots: tuple[SlotRef, ...]
    expires_in_s: float
    cached: int = 0
    estimated_load_s: float = 0.0
    estimated_recompute_s: float = 0.0
    more: tuple[LoadLease, ...] = ()

    @classmethod
    def from_proto(cls, msg: pb.AcquireLoadResponse) -> LoadLease:
        """Convert an ``AcquireLoadResponse``."""
        return cls(
            msg.lease_id,
            _slots(msg.slots),
            msg.expires_in_s,
            msg.cached,
            msg.estimated_load_s,
            msg.estimated_recompute_s,
            tuple(cls.from_proto(m) for m in msg.more),
        )


@dataclass(frozen=True, slots=True)
class PrefillClaimInfo:
    """What a single-flight prefill claim granted (positions count chunks of the request's keys).

    Attributes:
        claim_id: the claim on the chunks this request leads (0 when it leads none).
        cached: contiguous chunks cached when the claim was made.
        wait: chunks after ``cached`` other requests compute: wait for them.
        lead: chunks after ``cached + wait`` this request leads: compute and publish them, or release.
        takeovers: of those, chunks an earlier leader gave up or lost at its TTL.
    """

    claim_id: int
    cached: int
    wait: int
    lead: int
    takeovers: int

    @classmethod
    def from_proto(cls, msg: pb.ClaimPrefillResponse) -> PrefillClaimInfo:
        """Convert a ``ClaimPrefillResponse``."""
        return cls(msg.claim_id, msg.cached, msg.wait, msg.lead, msg.takeovers)


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
        data: the raw (decompressed) chunk bytes, ``chunk_bytes`` long: the buffer it was assembled in, or
            a read-only view of the received message when it came whole in one raw piece and the receiver
            lent it (see :class:`~.stream.StreamAssembler`).
        source: the tier the chunk's bytes came from (None: the daemon did not say).
    """

    index: int
    key: bytes
    data: bytearray | memoryview
    source: TierLevel | None = None

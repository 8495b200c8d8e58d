"""Snapshots of the cache's state and counters (core exposes snapshots; only the daemon exports metrics).

Primitives:
    TierStats: one tier's space and traffic counters.
    CacheStats: all tiers plus cache-wide counters.
    EventKind, ChunkEvent: what subscribers of the cache manager hear (stored / removed chunks).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tiercache.prefill import PrefillStats
from tiercache.tiers.base import TierLevel


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier since the cache manager started.

    Attributes:
        level: which tier.
        chunks: committed chunks now.
        used_bytes: bytes they occupy now.
        capacity_bytes: the tier's bound.
        hits: chunk reads served by this tier.
        misses: chunk reads that looked in this tier and did not find the chunk.
        evictions: chunks removed to make room.
        promotions: chunks copied into this tier from a slower one.
        demotions: chunks copied into this tier from a faster one (write-downs and evictions).
        corrupt_reads: values that failed their checksum (served as misses, deleted).
        lookup_hit_tokens: tokens of engine lookups' cached prefixes whose fastest copy was here.
        load_success_tokens: tokens loaded into engines (leased intact, in time) that came from here.
        effective_hit_tokens: prefill tokens engines reported skipped thanks to chunks from here.
        latency_s: measured (or prior) fixed cost of a read from this tier.
        bytes_per_s: measured (or prior) read bandwidth of this tier.
    """

    level: TierLevel
    chunks: int
    used_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evictions: int
    promotions: int
    demotions: int
    corrupt_reads: int
    lookup_hit_tokens: int = 0
    load_success_tokens: int = 0
    effective_hit_tokens: int = 0
    latency_s: float = 0.0
    bytes_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the whole cache.

    Attributes:
        tiers: per tier, fastest first.
        namespaces: registered namespaces.
        active_leases: leases not yet released or expired.
        expired_leases: leases reclaimed at their TTL since start.
        single_flight_joins: reads or promotions that joined one already in flight instead of doing I/O.
        pending_writes: write-downs queued or running.
        failed_writes: write-downs that could not find room (the chunk stayed only where it was).
        prefill: single-flight prefill counters.
        recomputed_tokens: prefill tokens engines reported recomputing although they had looked them up.
    """

    tiers: tuple[TierStats, ...]
    namespaces: int
    active_leases: int
    expired_leases: int
    single_flight_joins: int
    pending_writes: int
    failed_writes: int
    prefill: PrefillStats
    recomputed_tokens: int = 0

    def tier(self, level: TierLevel) -> TierStats:
        """The stats of one tier.

        Raises:
            KeyError: the cache has no such tier.
        """
        for t in self.tiers:
            if t.level == level:
                return t
        raise KeyError(level)


class EventKind(enum.Enum):
    """What happened to a chunk in a tier."""

    STORED = "stored"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class ChunkEvent:
    """A chunk appeared in or left a tier.

    Attributes:
        kind: stored or removed.
        level: the tier.
        namespace_id: the chunk's namespace.
        key: the chunk key.
        evicted: for REMOVED, whether it was evicted for room (False: deleted, corrupt or purged).
    """

    kind: EventKind
    level: TierLevel
    namespace_id: bytes
    key: bytes
    evicted: bool = False

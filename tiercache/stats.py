"""Snapshots of the cache's state and counters: THE stats schema (core exposes snapshots; only the daemon
exports metrics).

Every figure is a field of one of the dataclasses here, with its meaning next to it in the field's metadata
(:class:`StatInfo`: help text, gauge or counter, the metric name where it departs from the field's). The wire
conversion (:mod:`tiercache.wire.stats`), the daemon's Prometheus families and the connector's
``TierCacheClient.stats()`` are all derived from these fields: adding a figure is adding a field here (and
to the ``.proto``).

Primitives:
    StatKind, StatInfo: what a figure is (gauge or counter, help text); ``gauge`` / ``counter`` build a
        field's metadata, ``stat_info`` reads it back, ``wire_name`` gives the field's name on the wire.
    TierStats: one tier's space and traffic counters.
    PrefillStats: single-flight prefill counters.
    CacheStats: all tiers plus cache-wide counters.
    EventKind, ChunkEvent: what subscribers of the cache manager hear (stored / removed chunks).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tiercache.tiers.base import TierLevel

_INFO = "tiercache.stat"
"""Metadata key of a field's :class:`StatInfo`."""
_WIRE = "tiercache.wire_name"
"""Metadata key of a field's name on the wire, where it differs from the field's."""


class StatKind(enum.Enum):
    """How a figure moves."""

    GAUGE = "gauge"
    """A level now (it goes up and down)."""
    COUNTER = "counter"
    """A count since the cache started (it never decreases)."""


@dataclass(frozen=True, slots=True)
class StatInfo:
    """What one stats field means.

    Attributes:
        help: one line saying what the figure counts (the metric's HELP text).
        kind: gauge or counter.
        metric: the metric's name after ``tiercache_`` when it is not the group's prefix plus the field name.
    """

    help: str
    kind: StatKind
    metric: str | None = None


def gauge(help: str, metric: str | None = None) -> Mapping[str, object]:
    """Field metadata of a level-now figure."""
    return MappingProxyType({_INFO: StatInfo(help, StatKind.GAUGE, metric)})


def counter(help: str, metric: str | None = None) -> Mapping[str, object]:
    """Field metadata of a count-since-start figure."""
    return MappingProxyType({_INFO: StatInfo(help, StatKind.COUNTER, metric)})


def stat_info(f: dataclasses.Field[Any]) -> StatInfo | None:
    """The figure a field holds; None for a field that is not one (a tier's level, nested stats)."""
    info = f.metadata.get(_INFO)
    return info if isinstance(info, StatInfo) else None


def wire_name(f: dataclasses.Field[Any]) -> str:
    """The name of the field's counterpart on the wire (the field's own name unless it says otherwise)."""
    return str(f.metadata.get(_WIRE, f.name))


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier since the cache manager started (each figure's meaning: its ``StatInfo``).

    The token counters are token-weighted and per source tier; ``latency_s`` and ``bytes_per_s`` are the
    measured (or prior) read rates; ``dropped_chunks`` counts the copies the cache meant to keep and could
    not (no room, an LMDB map full, a failed read or write), which are otherwise silent.

    Attributes:
        level: which tier (the label of every per-tier figure; ``tier`` on the wire).
    """

    level: TierLevel = field(metadata={_WIRE: "tier"})
    chunks: int = field(metadata=gauge("Chunks held by a tier"))
    used_bytes: int = field(metadata=gauge("Bytes used in a tier"))
    capacity_bytes: int = field(metadata=gauge("Capacity of a tier"))
    hits: int = field(metadata=counter("Chunk reads served by a tier"))
    misses: int = field(metadata=counter("Chunk reads that missed in a tier"))
    evictions: int = field(metadata=counter("Chunks evicted from a tier for room"))
    promotions: int = field(metadata=counter("Chunks copied into a tier from a slower one"))
    demotions: int = field(metadata=counter("Chunks copied into a tier from a faster one"))
    corrupt_reads: int = field(metadata=counter("Values that failed their checksum"))
    lookup_hit_tokens: int = field(
        default=0,
        metadata=counter(
            "Tokens of engine lookups' cached prefixes, by the fastest tier holding them", "lookup_hit_tokens"
        ),
    )
    load_success_tokens: int = field(
        default=0,
        metadata=counter(
            "Tokens engines reported copied in, intact and in time, by source tier", "load_success_tokens"
        ),
    )
    effective_hit_tokens: int = field(
        default=0,
        metadata=counter("Prefill tokens engines reported skipped, by source tier", "effective_hit_tokens"),
    )
    latency_s: float = field(
        default=0.0, metadata=gauge("Measured fixed cost of a read from a tier", "tier_read_latency_seconds")
    )
    bytes_per_s: float = field(
        default=0.0, metadata=gauge("Measured read bandwidth of a tier", "tier_read_bytes_per_second")
    )
    dropped_chunks: int = field(
        default=0,
        metadata=counter(
            "Chunks dropped without the copy that was due: a failed eviction demotion (counted at the "
            "evicting tier) or a failed write-down (counted at the target tier)"
        ),
    )
    errors: int = field(
        default=0,
        metadata=counter(
            "Calls to a tier's remote store that failed (unreachable, too slow, refused): each turns the "
            "shared tier off for a backoff; always 0 for local tiers"
        ),
    )
    payload_bytes: int = field(
        default=0,
        metadata=gauge("Bytes of the chunks held by a tier, without what rounding to whole pages adds"),
    )
    utilisation: float = field(
        default=0.0,
        metadata=gauge("Share of a tier's capacity that its chunks' own bytes fill (payload / capacity)"),
    )


@dataclass(frozen=True, slots=True)
class PrefillStats:
    """Counters of the single-flight prefill coordinator (each figure's meaning: its ``StatInfo``)."""

    active_claims: int = field(
        metadata=gauge("Single-flight prefill claims leading at least one unpublished chunk")
    )
    claimed_chunks: int = field(metadata=gauge("Chunks being computed under a single-flight prefill claim"))
    waits: int = field(
        metadata=counter("Prefill waits that found another request computing a chunk they needed")
    )
    takeovers: int = field(
        metadata=counter("Chunks claimed after their previous leader gave them up or died")
    )
    expired_claims: int = field(
        metadata=counter("Prefill claims that lapsed at their TTL (their leader died)")
    )


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the whole cache (each figure's meaning: its ``StatInfo``).

    Attributes:
        tiers: per tier, fastest first.
        prefill: single-flight prefill counters.
    """

    tiers: tuple[TierStats, ...]
    namespaces: int = field(metadata=gauge("Registered namespaces"))
    active_leases: int = field(metadata=gauge("Load leases held now"))
    expired_leases: int = field(metadata=counter("Leases and store tickets reclaimed at their TTL"))
    single_flight_joins: int = field(metadata=counter("Reads that joined one in flight"))
    pending_writes: int = field(metadata=gauge("Write-downs queued or running"))
    failed_writes: int = field(metadata=counter("Write-downs that found no room"))
    prefill: PrefillStats
    recomputed_tokens: int = field(
        default=0,
        metadata=counter("Prefill tokens engines reported recomputing although they had looked them up"),
    )
    deferred_writes: int = field(
        default=0,
        metadata=gauge("Write-downs kept for when the host has a core to spare (watermark write policy)"),
    )

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
        source: for STORED, the tier the copy was made from (a promotion, write-down or demotion: a chunk
            that arrived through the shared tier says SHARED); None for an engine's store, or a chunk
            found in the shared tier (stored there by another daemon).
    """

    kind: EventKind
    level: TierLevel
    namespace_id: bytes
    key: bytes
    evicted: bool = False
    source: TierLevel | None = None

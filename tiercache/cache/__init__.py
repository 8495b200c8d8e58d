"""The cache core: the index of which chunk lives in which tier, and the only code that moves chunks between
tiers. Import from here; the modules inside are its parts.

Primitives:
    CacheConfig: policies, minimum residency, lease TTL, prefetch bounds.
    CacheBuildConfig, build_cache: the one place tiers and a manager are assembled.
    CacheManager: the facade (register_namespace, lookup, stores, leased loads, promote/demote, pins,
        purge, prefill claims, subscribe, stats, flush, close).
    LookupResult, StoreTicket, StoreSlot, LoadTicket, LoadChunk, Prefetch, Listener: results.

Modules:
    manager: the facade: the public API, the lock rules and the wiring of the parts.
    checks: argument checks (counts, seconds, levels).  namespaces: the namespace registry.
    config, results: the config and result dataclasses.
    index: residency, the one recency record, holds, pins, counters.
    space: victim queues (heaps fed by the eviction policy's priority).
    leases: the lease and store-ticket table, reaped at TTL.
    mover: the one copy protocol (make room, reserve, copy, commit and index / abort and drop).
    stores, loads: two-phase stores; leases on slot tiers and copies out.
    writeback, prefetch: the background write-down worker and promotion pool.
    listeners: chunk-event subscribers.  claims: single-flight prefill claims against the index.
    build: assembly of tiers and manager from configuration.
"""

from tiercache.cache.build import CacheBuildConfig, build_cache
from tiercache.cache.config import CacheConfig
from tiercache.cache.manager import CacheManager
from tiercache.cache.results import (
    Listener,
    LoadChunk,
    LoadTicket,
    LookupResult,
    Prefetch,
    StoreSlot,
    StoreTicket,
)

__all__ = [
    "CacheBuildConfig",
    "CacheConfig",
    "CacheManager",
    "Listener",
    "LoadChunk",
    "LoadTicket",
    "LookupResult",
    "Prefetch",
    "StoreSlot",
    "StoreTicket",
    "build_cache",
]

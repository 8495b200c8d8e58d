"""The cache core: the index of which chunk lives in which tier, and the only code that moves chunks between
tiers. Import from here; the modules inside are its parts.

Primitives:
    CacheConfig: policies, minimum residency, lease TTL, prefetch bounds.
    CacheManager: the facade (register_namespace, lookup, stores, leased loads, promote/demote, pins,
        purge, prefill claims, subscribe, stats, flush, close).
    LookupResult, StoreTicket, StoreSlot, LoadTicket, LoadChunk, Prefetch: results.
"""

from tiercache.cache.manager import (
    CacheConfig,
    CacheManager,
    Listener,
    LoadChunk,
    LoadTicket,
    LookupResult,
    Prefetch,
    StoreSlot,
    StoreTicket,
)

__all__ = [
    "CacheConfig",
    "CacheManager",
    "Listener",
    "LoadChunk",
    "LoadTicket",
    "LookupResult",
    "Prefetch",
    "StoreSlot",
    "StoreTicket",
]

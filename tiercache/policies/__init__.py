"""Policies of the cache, each a family of small classes behind one interface chosen from an Enum registry.

Modules:
    eviction: which evictable chunk of a tier goes first (``lru``, ``lfu``, ``segmented``, ``adaptive``).
    shadow: key-only shadow caches that the adaptive eviction policy learns from.
    write: when a chunk is written down to slower tiers (``write_through``, ``on_evict``, ``selective``).
    load: how much of a cached prefix a load takes and how long it waits (``wait_complete``,
        ``best_effort``, ``timeout``, ``cost_aware``).
    registry: ``parse_kind``, the one way a policy name becomes its Enum member.
"""

from tiercache.policies.eviction import (
    AdaptivePolicy,
    Candidate,
    EvictionPolicy,
    EvictionPolicyKind,
    LfuPolicy,
    LruPolicy,
    SegmentedPolicy,
    make_eviction_policy,
)
from tiercache.policies.load import (
    BestEffort,
    CostAware,
    LoadPolicy,
    LoadPolicyKind,
    Timeout,
    WaitComplete,
    make_load_policy,
)
from tiercache.policies.write import (
    OnEvict,
    Selective,
    Watermark,
    WritePolicy,
    WritePolicyKind,
    WriteThrough,
    make_write_policy,
)

__all__ = [
    "AdaptivePolicy",
    "BestEffort",
    "Candidate",
    "CostAware",
    "EvictionPolicy",
    "EvictionPolicyKind",
    "LfuPolicy",
    "LoadPolicy",
    "LoadPolicyKind",
    "LruPolicy",
    "OnEvict",
    "SegmentedPolicy",
    "Selective",
    "Timeout",
    "WaitComplete",
    "Watermark",
    "WritePolicy",
    "WritePolicyKind",
    "WriteThrough",
    "make_eviction_policy",
    "make_load_policy",
    "make_write_policy",
]

"""Configuration of the cache core.

Primitives:
    CacheConfig: policies, minimum residency, lease TTL and its cap, the stop's write-down bound, prefetch
        bounds (its fields declare the daemon's policy and lifetime options).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.options import internal, option
from tiercache.parsers import parse_choice, parse_float, parse_int
from tiercache.policies import EvictionPolicyKind, WritePolicyKind

CATCH_UP_SPARE_CORES = 1.0
"""Idle host cores (the write-down worker's own CPU counted as idle) from which deferred write-downs run: a
whole core nobody used."""


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Policies and timing of the cache manager.

    Attributes:
        write_policy: when chunks are written down to slower tiers.
        eviction_policy: which evictable chunk goes first.
        selective_min_hits: reads after which the selective policy writes a chunk down.
        min_residency_s: a newly stored chunk is not evicted from a tier before this many seconds.
        lease_ttl_s: default lifetime of a load lease, store ticket or prefill claim.
        max_ttl_s: the longest lifetime a caller may ask for a lease, ticket or claim; a longer one is
            refused, so that a caller cannot hold slots (or a prefill) for ever. At least ``lease_ttl_s``.
        stop_write_down_s: at a stop, how long deferred write-downs (watermark policy) may still run.
        catch_up_spare_cores: idle host cores from which deferred write-downs run (tests: 0 always, ``inf``
            never).
        prefetch_workers: threads running background promotions.
        prefetch_inflight_bytes: bound on the bytes of promotions in flight at once, so that prefetching
            cannot take every free slot from stores.
    """

    write_policy: WritePolicyKind = option(
        "write_policy",
        parse=parse_choice(WritePolicyKind),
        help="when chunks are written down: watermark (write-through once the tier is half full, before that "
        "while the host has a core to spare), write_through, on_evict or selective",
        metavar="POLICY",
        default=WritePolicyKind.WATERMARK,
    )
    eviction_policy: EvictionPolicyKind = option(
        "eviction_policy",
        parse=parse_choice(EvictionPolicyKind),
        help="which chunk is evicted first: adaptive (recency or scan resistant, learnt per tier), lru, lfu or "
        "segmented (scan resistant)",
        metavar="POLICY",
        default=EvictionPolicyKind.ADAPTIVE,
    )
    selective_min_hits: int = option(
        "selective_min_hits",
        parse=parse_int,
        help="reads after which the selective policy writes a chunk down when it is evicted",
        metavar="INT",
        default=2,
    )
    min_residency_s: float = option(
        "min_residency_s",
        parse=parse_float,
        help="a newly stored chunk is not evicted from a tier before this many seconds",
        metavar="FLOAT",
        default=0.0,
    )
    lease_ttl_s: float = option(
        "lease_ttl_s",
        parse=parse_float,
        help="default lifetime of load leases and store tickets, seconds",
        metavar="FLOAT",
        default=30.0,
    )
    max_ttl_s: float = option(
        "max_ttl_s",
        parse=parse_float,
        help="longest lifetime an engine may ask for a load lease, store ticket or prefill claim, seconds "
        "(a longer one is refused with INVALID_ARGUMENT); at least --lease-ttl-s",
        metavar="FLOAT",
        default=300.0,
    )
    stop_write_down_s: float = option(
        "stop_write_down_s",
        parse=parse_float,
        help="at a stop, how long the write-downs the watermark policy deferred may still run, seconds (what "
        "is left is not in the slower tiers after a restart)",
        metavar="FLOAT",
        default=20.0,
    )
    catch_up_spare_cores: float = internal(CATCH_UP_SPARE_CORES)
    prefetch_workers: int = internal(4)
    prefetch_inflight_bytes: int = internal(256 << 20)

    def __post_init__(self) -> None:
        for name in ("prefetch_workers", "prefetch_inflight_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(name, f"must be a positive integer, got {value!r}")
        if not isinstance(self.write_policy, WritePolicyKind):
            raise InvalidArgumentError(
                "write_policy", f"must be a WritePolicyKind, got {self.write_policy!r}"
            )
        if not isinstance(self.eviction_policy, EvictionPolicyKind):
            raise InvalidArgumentError(
                "eviction_policy", f"must be an EvictionPolicyKind, got {self.eviction_policy!r}"
            )
        if not self.min_residency_s >= 0:
            raise InvalidArgumentError("min_residency_s", f"must be >= 0, got {self.min_residency_s!r}")
        if not (math.isfinite(self.stop_write_down_s) and self.stop_write_down_s >= 0):
            raise InvalidArgumentError(
                "stop_write_down_s",
                f"must be a finite number of seconds >= 0, got {self.stop_write_down_s!r}",
            )
        if not self.catch_up_spare_cores >= 0:
            raise InvalidArgumentError(
                "catch_up_spare_cores", f"must be >= 0, got {self.catch_up_spare_cores!r}"
            )
        if not self.lease_ttl_s > 0:
            raise InvalidArgumentError("lease_ttl_s", f"must be > 0, got {self.lease_ttl_s!r}")
        if not (math.isfinite(self.max_ttl_s) and self.max_ttl_s >= self.lease_ttl_s):
            raise InvalidArgumentError(
                "max_ttl_s",
                f"must be a finite number of seconds >= lease_ttl_s ({self.lease_ttl_s!r}), "
                f"got {self.max_ttl_s!r}",
            )

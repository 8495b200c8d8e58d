"""Per-tenant quotas: what one tenant of a shared cache may hold and ask for.

A quota bounds one tenant's bytes in L2, in L3 and in the shared (Redis) tier, its pinned bytes, its open
load leases and store tickets, the lifetime it may ask for a lease, ticket or prefill claim, and its RPC rate
(a token bucket the daemon applies; the core only carries the figures). Every limit is off at 0. The operator sets quotas next to the
tokens (``[quotas.default]`` and ``[quotas."tenant"]`` of the tokens file, read by the daemon); without a
quota table the cache behaves exactly as a single-tenant one.

How capacity is shared under pressure (hard quotas that are also guaranteed shares), per tier with a byte
quota:
    * a tenant's store that would take it over its quota first evicts the tenant's *own* chunks of that tier,
      in eviction-policy order (demoting them when a slower tier keeps them); when none of its own can go
      (leased or pinned), the store fails with the quota named: RESOURCE_EXHAUSTED on the wire;
    * a tenant's chunks are never evicted to make room for others while the tenant holds no more than its
      quota there: its quota is its guaranteed share. Chunks of a tenant above its share (it borrowed free
      space through promotions or write-downs) and chunks of tenants without a quota in that tier are
      evictable as before. With quotas summing to at most a tier's capacity, a greedy tenant can neither
      push another below its share nor hold more than its own quota for long (its next store trims it).

The shared tier's quota counts what this daemon knows of the tenant's chunks there (what it wrote, and
found on lookups): with several daemons on one store, each bounds what its own engines put there, and the
store's own eviction (``allkeys-lru``) bounds the rest; a fleet-wide count would need counters in the store.

Primitives:
    QuotaExceededError: a limit was hit (a ``CapacityError``: RESOURCE_EXHAUSTED), naming the limit.
    TenantQuota: the limits of one tenant; ``tier_bytes(level)``.
    QuotaTable: the default quota and the per-tenant ones; ``of(tenant)``, ``active``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from tiercache.errors import CapacityError, InvalidArgumentError
from tiercache.options import option
from tiercache.parsers import parse_float, parse_int, parse_size
from tiercache.tiers.base import TierLevel


class QuotaExceededError(CapacityError):
    """A tenant hit one of its limits.

    Attributes:
        limit: the limit's name as in the quota table (``l2_bytes``, ``leases``, ...).
        value: the limit's value.
    """

    def __init__(self, tenant: str, limit: str, value: float, detail: str) -> None:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        super().__init__(f"quota {limit} = {shown} of tenant {tenant!r} reached: {detail}")
        self.limit = limit
        self.value = value


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """The limits of one tenant; 0 turns a limit off. Each field is a key of a ``[quotas.<tenant>]`` table of
    the daemon's tokens file, declared with its parser and help (:mod:`tiercache.options`)."""

    l2_bytes: int = option(
        "l2_bytes",
        parse=parse_size,
        help="bytes the tenant's chunks may take in L2 (slot bytes); also its guaranteed L2 share",
        metavar="SIZE",
        default=0,
        note="off",
    )
    l3_bytes: int = option(
        "l3_bytes",
        parse=parse_size,
        help="bytes the tenant's chunks may take in L3; also its guaranteed L3 share",
        metavar="SIZE",
        default=0,
        note="off",
    )
    shared_bytes: int = option(
        "shared_bytes",
        parse=parse_size,
        help="bytes the tenant's chunks may take in the shared (Redis) tier, as this daemon counts them "
        "(what it wrote or found there); also its guaranteed share of it",
        metavar="SIZE",
        default=0,
        note="off",
    )
    pinned_bytes: int = option(
        "pinned_bytes",
        parse=parse_size,
        help="chunk bytes the tenant may pin (a pinned namespace's chunks count, and so do stores into it)",
        metavar="SIZE",
        default=0,
        note="off",
    )
    leases: int = option(
        "leases", parse=parse_int, help="load leases the tenant may hold open at once", default=0, note="off"
    )
    tickets: int = option(
        "tickets",
        parse=parse_int,
        help="store tickets the tenant may hold open at once",
        default=0,
        note="off",
    )
    max_ttl_s: float = option(
        "max_ttl_s",
        parse=parse_float,
        help="the longest lease, ticket or prefill-claim lifetime the tenant may ask for (the default "
        "lifetime is shortened to it)",
        default=0.0,
        note="off",
    )
    rpc_rate: float = option(
        "rpc_rate",
        parse=parse_float,
        help="RPCs per second the tenant may make, on average (the daemon's token bucket)",
        default=0.0,
        note="off",
    )
    rpc_burst: int = option(
        "rpc_burst",
        parse=parse_int,
        help="RPCs the tenant may make at once above the rate (0: max(1, rpc_rate))",
        default=0,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in (int, "int"):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidArgumentError(f.name, f"must be a non-negative integer, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidArgumentError(f.name, f"must be a non-negative number, got {value!r}")

    def tier_bytes(self, level: TierLevel) -> int:
        """The byte quota of a tier (0: none; L1 has none)."""
        if level == TierLevel.L2:
            return self.l2_bytes
        if level == TierLevel.L3:
            return self.l3_bytes
        if level == TierLevel.SHARED:
            return self.shared_bytes
        return 0

    @property
    def limited(self) -> bool:
        """Whether any limit is on."""
        return any(getattr(self, f.name) for f in fields(self))


NO_QUOTA = TenantQuota()
"""A tenant without limits."""


@dataclass(frozen=True, slots=True)
class QuotaTable:
    """Quotas by tenant.

    Attributes:
        default: the quota of every tenant not named in ``tenants``.
        tenants: per-tenant quotas (each replaces the default as a whole).
    """

    default: TenantQuota = NO_QUOTA
    tenants: Mapping[str, TenantQuota] = field(default_factory=lambda: MappingProxyType({}))

    def of(self, tenant: str) -> TenantQuota:
        """The quota of a tenant."""
        return self.tenants.get(tenant, self.default)

    @property
    def active(self) -> bool:
        """Whether any tenant has a limit."""
        return self.default.limited or any(q.limited for q in self.tenants.values())

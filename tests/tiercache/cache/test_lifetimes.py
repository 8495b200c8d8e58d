"""Capped lifetimes: leases, store tickets and prefill claims asked for longer than ``max_ttl_s`` are refused.

The cap is checked where the manager resolves every TTL, so a refused call leaves nothing behind: no lease,
no reservation, no claim.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager, checks
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace, chunk_keys
from tiercache.tiers.host import HostTier, HostTierConfig

NOW = 1000.0
CAP = 120.0


class Harness:
    """A manager over one L2 tier with a fixed clock, a namespace registered and one chunk stored."""

    def __init__(self, namespace: Namespace, config: CacheConfig | None) -> None:
        n = namespace.layout.chunk_bytes
        self.tier = HostTier(
            HostTierConfig(capacity_bytes=8 * n, slot_bytes=n, segment_prefix="tiercache-test-ttl")
        )
        self.cache = CacheManager([self.tier], config, clock=lambda: NOW)
        self.ns_id = self.cache.register_namespace(namespace)
        c = namespace.layout.chunk_tokens
        self.stored = chunk_keys(namespace, list(range(c)))
        self.fresh = chunk_keys(namespace, [100_000 + t for t in range(2 * c)])
        assert self.cache.put(self.ns_id, self.stored, [torch.zeros(n, dtype=torch.uint8)]) == 1


@pytest.fixture
def capped(namespace: Namespace) -> Iterator[Harness]:
    h = Harness(namespace, CacheConfig(lease_ttl_s=10.0, max_ttl_s=CAP))
    yield h
    h.cache.close()


@pytest.fixture
def default(namespace: Namespace) -> Iterator[Harness]:
    h = Harness(namespace, None)
    yield h
    h.cache.close()


def refused(value: float, cap: float = CAP) -> pytest.RaisesContext[InvalidArgumentError]:
    return pytest.raises(
        InvalidArgumentError, match=rf"^ttl_s: must be at most max_ttl_s = {cap:g} seconds, got {value!r}$"
    )


@pytest.mark.parametrize("ttl", [CAP + 0.001, 1e9])
def test_above_the_cap_every_lifetime_is_refused_and_nothing_is_held(capped: Harness, ttl: float) -> None:
    h = capped
    with refused(ttl):
        h.cache.acquire(h.ns_id, h.stored, ttl_s=ttl)
    with refused(ttl):
        h.cache.begin_store(h.ns_id, h.fresh, ttl_s=ttl)
    with refused(ttl):
        h.cache.claim_prefill(h.ns_id, h.fresh, ttl_s=ttl)
    stats = h.cache.stats()
    assert stats.active_leases == 0 and stats.prefill.active_claims == 0
    assert h.tier.usage().reserved_bytes == 0
    # The chunks a refused ticket would have reserved are still free to store, and nobody leads them.
    claim = h.cache.claim_prefill(h.ns_id, h.fresh)
    assert (claim.lead, claim.wait) == (2, 0)


def test_at_the_cap_every_lifetime_is_granted_in_full(capped: Harness) -> None:
    h = capped
    lease = h.cache.acquire(h.ns_id, h.stored, ttl_s=CAP)
    assert len(lease.chunks) == 1 and lease.expires_at == NOW + CAP
    ticket = h.cache.begin_store(h.ns_id, h.fresh, ttl_s=CAP)
    assert len(ticket.slots) == 2 and ticket.expires_at == NOW + CAP
    h.cache.abort_store(ticket.ticket_id)
    claim = h.cache.claim_prefill(h.ns_id, h.fresh, ttl_s=CAP)
    assert claim.lead == 2 and claim.expires_at == NOW + CAP


def test_no_ttl_is_the_lease_ttl(capped: Harness) -> None:
    h = capped
    assert h.cache.acquire(h.ns_id, h.stored).expires_at == NOW + 10.0
    assert h.cache.begin_store(h.ns_id, h.fresh).expires_at == NOW + 10.0
    assert h.cache.claim_prefill(h.ns_id, h.fresh).expires_at == NOW + 10.0


def test_the_default_cap_is_300_s_and_the_default_ttl_unchanged(default: Harness) -> None:
    h = default
    assert (CacheConfig().lease_ttl_s, CacheConfig().max_ttl_s) == (30.0, 300.0)
    assert h.cache.acquire(h.ns_id, h.stored).expires_at == NOW + 30.0
    assert h.cache.acquire(h.ns_id, h.stored, ttl_s=300).expires_at == NOW + 300.0
    with refused(300.5, cap=300.0):
        h.cache.acquire(h.ns_id, h.stored, ttl_s=300.5)
    with refused(1e9, cap=300.0):
        h.cache.begin_store(h.ns_id, h.fresh, ttl_s=1e9)
    with refused(1e9, cap=300.0):
        h.cache.claim_prefill(h.ns_id, h.fresh, ttl_s=1e9)


def test_lifetime_check() -> None:
    assert checks.lifetime(None, 30.0, 300.0) == 30.0
    assert checks.lifetime(300, 30.0, 300.0) == 300.0 and isinstance(checks.lifetime(5, 30.0, 300.0), float)
    with pytest.raises(InvalidArgumentError, match=r"^ttl_s: must be a positive number of seconds, got 0$"):
        checks.lifetime(0, 30.0, 300.0)
    with pytest.raises(
        InvalidArgumentError, match=r"^ttl_s: must be at most max_ttl_s = 300 seconds, got inf"
    ):
        checks.lifetime(float("inf"), 30.0, 300.0)
    with pytest.raises(InvalidArgumentError, match=r"^claim_ttl_s: must be at most max_ttl_s = 1.5 seconds"):
        checks.lifetime(2, 1.0, 1.5, field="claim_ttl_s")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_ttl_s": 0.0}, "must be a finite number of seconds >= lease_ttl_s (30.0), got 0.0"),
        ({"max_ttl_s": -1.0}, "got -1.0"),
        (
            {"lease_ttl_s": 60.0, "max_ttl_s": 59.0},
            "must be a finite number of seconds >= lease_ttl_s (60.0)",
        ),
        ({"max_ttl_s": float("nan")}, "got nan"),
        ({"max_ttl_s": float("inf")}, "got inf"),
    ],
)
def test_a_bad_cap_is_refused_naming_max_ttl_s(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        CacheConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == "max_ttl_s" and str(info.value).startswith("max_ttl_s: ")
    assert message in str(info.value)


def test_a_cap_equal_to_the_lease_ttl_is_accepted() -> None:
    assert CacheConfig(lease_ttl_s=5.0, max_ttl_s=5.0).max_ttl_s == 5.0

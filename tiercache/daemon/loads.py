"""AcquireLoad's load policies on the daemon side: which keys to lease and how long to wait for promotion.

The servicer resolves the wire policy against what the engine declared at registration
(:class:`~tiercache.daemon.handles.HandleInfo`) into one of the core's load policies
(:mod:`tiercache.policies.load`), then runs :func:`run_load` in an executor:

* ``WAIT_COMPLETE``: lease the whole cached prefix, however long promotion from L3 takes.
* ``BEST_EFFORT``: lease only what is in shared memory now (``wait_s = 0``).
* ``TIMEOUT``: wait for promotion up to ``timeout_s``, or the registered deadline model's value for the
  prompt (``prompt_tokens``, else the keys' tokens). The deadline counts from the RPC's arrival, so time
  spent queueing for the executor is part of it; promotions still running at the deadline go on in the
  background, so that a retry or the next request finds the chunks in shared memory.
* ``COST_AWARE``: the cache manager's plan (measured tier rates against the registered prefill model) picks
  the prefix worth loading, which is then leased with ``WAIT_COMPLETE``.

Primitives:
    LoadOutcome: the lease, the cached prefix and the cost estimates behind the decision.
    resolve_policy: the request's policy with the declared models (validates that the needed one exists).
    run_load: the blocking settlement (:mod:`.settle`) + lookup + plan + acquire.
    run_load_now: the same at once, when nothing in it can wait (else None: run :func:`run_load`).
    INLINE_LOAD_KEYS: the longest chain :func:`run_load_now` takes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.cache import CacheManager, LoadTicket
from tiercache.policies.load import CostPlan, LoadPolicy, LoadPolicyKind, make_load_policy
from tiercache.tiers.base import TierLevel
from tiercache.tiers.slots import SlotPoolTier

from .handles import HandleInfo
from .settle import Settled, apply

INLINE_LOAD_KEYS = 128
"""The longest chain leased on the event loop (~5-15 µs of the loop per chunk); longer ones go to the
executor."""
_LATE_WAIT_S = 1e-3
"""A deadline that passed while the call queued still starts background promotion (for the next load)."""


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """What AcquireLoad answers.

    Attributes:
        ticket: the leased chunks (``lease_id`` 0 when none).
        cached: contiguous chunks cached in any tier when the load looked.
        plan: for ``COST_AWARE``, the decision and its estimates; else None.
    """

    ticket: LoadTicket
    cached: int
    plan: CostPlan | None


def resolve_policy(kind: LoadPolicyKind, timeout_s: float, info: HandleInfo) -> LoadPolicy:
    """The request's policy, with the models the engine declared at Register filling what it leaves open.

    Args:
        kind: the request's policy.
        timeout_s: the request's ``timeout_s`` (0: unset, the declared deadline model decides).
        info: the handle's declared models.

    Raises:
        InvalidArgumentError: ``timeout_s`` for TIMEOUT without a timeout or a declared deadline model;
            ``prefill`` for COST_AWARE without a declared prefill model.
    """
    return make_load_policy(kind, timeout_s=timeout_s or None).resolve(info.deadline, info.prefill)


def run_load(
    manager: CacheManager,
    handle: bytes,
    keys: Sequence[bytes],
    level: TierLevel,
    ttl_s: float | None,
    policy: LoadPolicy,
    wait_s: float | None,
    arrived: float,
    settled: Settled | None = None,
) -> LoadOutcome:
    """Settle what the request carries, look the chain up, let the policy choose its prefix and lease it
    (blocking: run it in an executor).

    Args:
        manager: the cache.
        handle: the namespace id.
        keys: the request's chain.
        level: the slot tier to lease in.
        ttl_s: lease lifetime (None: the default).
        policy: from :func:`resolve_policy`.
        wait_s: the policy's ``wait_s`` for the prompt; counted from ``arrived``.
        arrived: ``time.monotonic()`` when the RPC arrived.
        settled: the request's settlement (leases ended and usage recorded first).

    Raises:
        NotFoundError, InvalidArgumentError: from the cache manager.
    """
    if settled is not None and not settled.empty:
        apply(manager, settled)
    cached = manager.lookup(handle, keys).chunks
    choice = policy.choose(keys[:cached], lambda ks, prefill: manager.plan_load(handle, ks, prefill, level))
    if wait_s is not None and wait_s > 0:
        wait_s = max(_LATE_WAIT_S, arrived + wait_s - time.monotonic())
    ticket = manager.acquire(handle, choice.keys, level, ttl_s, wait_s)
    return LoadOutcome(ticket, cached, choice.plan)


def run_load_now(
    manager: CacheManager,
    handle: bytes,
    keys: Sequence[bytes],
    level: TierLevel,
    ttl_s: float | None,
    policy: LoadPolicy,
    settled: Settled | None = None,
) -> LoadOutcome | None:
    """:func:`run_load` without waiting, or None (nothing done) when it might wait: the chain is longer
    than :data:`INLINE_LOAD_KEYS`, the index lock is taken or a shared tier would be asked
    (``CacheManager.uncontended``), part of the cached prefix is not in ``level`` yet (a promotion), or
    ``level`` checks each chunk's bytes before leasing it. An event loop calls it instead of an executor hop
    (which costs more than the lease of a few dozen chunks) and :func:`run_load` in an executor on None.

    The outcome is :func:`run_load`'s: with the whole cached prefix in ``level`` and the lock held
    throughout, nothing is promoted or waited for under any policy.

    Raises:
        NotFoundError, InvalidArgumentError: from the cache manager.
    """
    tier = manager.tier(level)
    if len(keys) > INLINE_LOAD_KEYS or (isinstance(tier, SlotPoolTier) and tier.verify_loads):
        return None
    with manager.uncontended() as free:
        if not free:
            return None
        found = manager.lookup(handle, keys)
        if found.by_tier.get(level, 0) < found.chunks:
            return None
        if settled is not None and not settled.empty:
            apply(manager, settled)
        choice = policy.choose(
            keys[: found.chunks], lambda ks, prefill: manager.plan_load(handle, ks, prefill, level)
        )
        ticket = manager.acquire(handle, choice.keys, level, ttl_s, 0.0)
        return LoadOutcome(ticket, found.chunks, choice.plan)

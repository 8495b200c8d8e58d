"""AcquireLoad's load policies on the daemon side: which keys to lease and how long to wait for promotion.

The servicer resolves the wire policy against what the engine declared at registration
(:class:`~tiercache.daemon.handles.HandleInfo`), then runs :func:`run_load` in an executor:

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
    policy_wait_s: a policy's promotion wait (validates that the needed model was declared).
    run_load: the blocking lookup + plan + acquire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.cache import CacheManager, LoadTicket
from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import CostPlan, LoadPolicyKind, PrefillModel
from tiercache.tiers.base import TierLevel

from .handles import HandleInfo

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


def policy_wait_s(
    kind: LoadPolicyKind, timeout_s: float, prompt_tokens: int, num_keys: int, info: HandleInfo
) -> float | None:
    """How long a load may wait for promotion: None as long as it takes, 0 not at all.

    Args:
        kind: the policy.
        timeout_s: the request's ``timeout_s`` (0: unset).
        prompt_tokens: the request's ``prompt_tokens`` (0: the keys' tokens).
        num_keys: the number of keys of the request.
        info: the handle's declared models.

    Raises:
        InvalidArgumentError: ``timeout_s`` for TIMEOUT without a timeout or a declared deadline model;
            ``prefill`` for COST_AWARE without a declared prefill model.
    """
    if kind is LoadPolicyKind.BEST_EFFORT:
        return 0.0
    if kind is LoadPolicyKind.TIMEOUT:
        if timeout_s > 0:
            return timeout_s
        if info.deadline is None:
            raise InvalidArgumentError(
                "timeout_s",
                "LOAD_POLICY_TIMEOUT needs timeout_s > 0 or a deadline model declared at Register",
            )
        return info.deadline.deadline_s(prompt_tokens or num_keys * info.chunk_tokens)
    if kind is LoadPolicyKind.COST_AWARE and info.prefill is None:
        raise InvalidArgumentError(
            "prefill", "LOAD_POLICY_COST_AWARE needs the engine's prefill model, declared at Register"
        )
    return None


def run_load(
    manager: CacheManager,
    handle: bytes,
    keys: Sequence[bytes],
    level: TierLevel,
    ttl_s: float | None,
    wait_s: float | None,
    prefill: PrefillModel | None,
    arrived: float,
) -> LoadOutcome:
    """Look the chain up, plan (cost-aware when ``prefill`` is given) and lease (blocking: run it in an executor).

    Args:
        manager: the cache.
        handle: the namespace id.
        keys: the request's chain.
        level: the slot tier to lease in.
        ttl_s: lease lifetime (None: the default).
        wait_s: from :func:`policy_wait_s`; counted from ``arrived``.
        prefill: the prefill model of a cost-aware load, else None.
        arrived: ``time.monotonic()`` when the RPC arrived.

    Raises:
        NotFoundError, InvalidArgumentError: from the cache manager.
    """
    cached = manager.lookup(handle, keys).chunks
    plan = None
    chosen = list(keys[:cached])
    if prefill is not None:
        plan = manager.plan_load(handle, chosen, prefill, level)
        chosen = chosen[: plan.chunks]
    if wait_s is not None and wait_s > 0:
        wait_s = max(_LATE_WAIT_S, arrived + wait_s - time.monotonic())
    ticket = manager.acquire(handle, chosen, level, ttl_s, wait_s)
    return LoadOutcome(ticket, cached, plan)

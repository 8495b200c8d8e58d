"""Load policies: how much of a cached prefix is worth loading, and how long to wait for it.

A cache hit is worth taking only when its bytes arrive before recompute would have finished. The engine
chooses a policy per load:

* ``wait_complete``: load the whole cached prefix, however long promotion takes.
* ``best_effort``: load only what is already in the shared-memory tier now.
* ``timeout``: wait for promotion up to a deadline (given, or derived from the prompt length); what has not
  arrived by then is recomputed.
* ``cost_aware``: load only the contiguous prefix whose estimated load time (per-tier rates measured at run
  time) beats its estimated recompute time (the engine's declared prefill model).

Primitives:
    LoadPolicyKind: the four policies.
    PrefillModel: the engine's prefill cost, linear (tokens/s) plus an optional quadratic term.
    DeadlineModel: ``base + per-1K-token term``, capped.
    LoadRequest: a policy with its parameters.
    CostPlan: a cost-aware decision and the estimates behind it.
    plan_cost_aware: choose the prefix to load.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.tiers.base import TierLevel


class LoadPolicyKind(enum.Enum):
    """Names of the load policies."""

    WAIT_COMPLETE = "wait_complete"
    BEST_EFFORT = "best_effort"
    TIMEOUT = "timeout"
    COST_AWARE = "cost_aware"


def _non_negative(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise InvalidArgumentError(field, f"must be a non-negative number, got {value!r}")


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """What prefill of a token range costs the engine.

    ``seconds(start, end) = (end - start) / tokens_per_s + quadratic_s * (end**2 - start**2)``: the linear
    term is the MLP/projection work, the quadratic one attention over the growing context.

    Attributes:
        tokens_per_s: prefill throughput for short contexts (positive).
        quadratic_s: seconds per token-squared of attention cost (0 for a linear model).
    """

    tokens_per_s: float
    quadratic_s: float = 0.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.tokens_per_s, bool)
            or not isinstance(self.tokens_per_s, (int, float))
            or not self.tokens_per_s > 0
        ):
            raise InvalidArgumentError(
                "tokens_per_s", f"must be a positive number, got {self.tokens_per_s!r}"
            )
        _non_negative("quadratic_s", self.quadratic_s)

    def seconds(self, start: int, end: int) -> float:
        """Estimated prefill time of tokens ``[start, end)`` given the ones before ``start`` are cached."""
        return (end - start) / self.tokens_per_s + self.quadratic_s * (end * end - start * start)


@dataclass(frozen=True, slots=True)
class DeadlineModel:
    """A load deadline from the prompt length: ``min(cap_s, base_s + per_1k_tokens_s * tokens / 1000)``."""

    base_s: float
    per_1k_tokens_s: float = 0.0
    cap_s: float = float("inf")

    def __post_init__(self) -> None:
        _non_negative("base_s", self.base_s)
        _non_negative("per_1k_tokens_s", self.per_1k_tokens_s)
        _non_negative("cap_s", self.cap_s)

    def deadline_s(self, prompt_tokens: int) -> float:
        """Seconds a load of a ``prompt_tokens``-long prompt may wait."""
        return min(self.cap_s, self.base_s + self.per_1k_tokens_s * prompt_tokens / 1000.0)


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """A load policy and its parameters.

    Attributes:
        kind: the policy.
        timeout_s: for ``timeout``: the deadline; None to derive it from ``deadline`` and the prompt length.
        deadline: for ``timeout`` without ``timeout_s``.
        prefill: for ``cost_aware``: the engine's prefill model.
    """

    kind: LoadPolicyKind = LoadPolicyKind.WAIT_COMPLETE
    timeout_s: float | None = None
    deadline: DeadlineModel | None = None
    prefill: PrefillModel | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, LoadPolicyKind):
            raise InvalidArgumentError("policy", f"must be a LoadPolicyKind, got {self.kind!r}")
        if self.timeout_s is not None:
            _non_negative("timeout_s", self.timeout_s)
        if self.kind is LoadPolicyKind.TIMEOUT and self.timeout_s is None and self.deadline is None:
            raise InvalidArgumentError("timeout_s", "the timeout policy needs timeout_s or a deadline model")
        if self.kind is LoadPolicyKind.COST_AWARE and self.prefill is None:
            raise InvalidArgumentError("prefill", "the cost_aware policy needs the engine's prefill model")

    def wait_s(self, prompt_tokens: int) -> float | None:
        """How long promotion may be waited for: None = as long as it takes, 0 = not at all."""
        if self.kind is LoadPolicyKind.BEST_EFFORT:
            return 0.0
        if self.kind is LoadPolicyKind.TIMEOUT:
            if self.timeout_s is not None:
                return self.timeout_s
            assert self.deadline is not None
            return self.deadline.deadline_s(prompt_tokens)
        return None


@dataclass(frozen=True, slots=True)
class CostPlan:
    """A cost-aware decision.

    Attributes:
        chunks: contiguous chunks to load (the rest is recomputed).
        load_s: estimated time to load them.
        recompute_s: estimated time to recompute them instead.
    """

    chunks: int
    load_s: float
    recompute_s: float


def plan_cost_aware(
    tiers: Sequence[TierLevel],
    chunk_tokens: int,
    load_seconds: Callable[[TierLevel], float],
    prefill: PrefillModel,
) -> CostPlan:
    """Choose how many chunks of a cached prefix to load.

    Args:
        tiers: for each chunk of the cached prefix, the fastest tier holding it.
        chunk_tokens: tokens per chunk.
        load_seconds: estimated time to bring one chunk from a tier into the engine.
        prefill: the engine's prefill model.

    Returns:
        The prefix length with the largest estimated saving (recompute time minus load time); 0 when no
        prefix is cheaper to load than to recompute.
    """
    best = CostPlan(0, 0.0, 0.0)
    load = 0.0
    for i, level in enumerate(tiers):
        load += load_seconds(level)
        recompute = prefill.seconds(0, (i + 1) * chunk_tokens)
        if recompute - load > best.recompute_s - best.load_s:
            best = CostPlan(i + 1, load, recompute)
    return best

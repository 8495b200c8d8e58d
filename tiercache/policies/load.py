"""Load policies: how much of a cached prefix a load takes, and how long it waits for promotion.

A cache hit is worth taking only when its bytes arrive before recompute would have finished. The engine
chooses a policy per load; the daemon, the connector and the benchmark all decide through these objects:

* ``wait_complete``: load the whole cached prefix, however long promotion takes.
* ``best_effort``: load only what is already in the shared-memory tier now.
* ``timeout``: wait for promotion up to a deadline (given, or derived from the prompt length by a deadline
  model); what has not arrived by then is recomputed.
* ``cost_aware``: load only the contiguous prefix whose estimated load time (per-tier rates measured at run
  time) beats its estimated recompute time (the engine's declared prefill model).

A ``timeout`` or ``cost_aware`` policy may leave its model open: the engine declares one for its namespace
at registration, and :meth:`LoadPolicy.resolve` fills it in where the load is served.

Primitives:
    LoadPolicyKind: the four policies (the registry's keys).
    PrefillModel: the engine's prefill cost, linear (tokens/s) plus an optional quadratic term.
    DeadlineModel: ``base + per-1K-token term``, capped.
    CostPlan: a cost-aware decision and the estimates behind it.
    plan_cost_aware: choose the prefix to load.
    LoadChoice: the keys a load takes and the plan behind them.
    LoadPolicy: the interface (resolve, wait_s, choose) and its constructors; WaitComplete, BestEffort,
        Timeout, CostAware: the policies.
    make_load_policy: a policy from its kind or name (unknown names fail with the valid ones).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from tiercache.errors import InvalidArgumentError
from tiercache.policies.registry import parse_kind
from tiercache.tiers.base import TierLevel


class LoadPolicyKind(enum.Enum):
    """Names of the load policies (keys of the registry behind :func:`make_load_policy`)."""

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


Planner = Callable[[Sequence[bytes], PrefillModel], CostPlan]
"""A cost-aware plan of a chain's cached keys under a prefill model (the cache manager's ``plan_load``)."""


@dataclass(frozen=True, slots=True)
class LoadChoice:
    """What a load takes.

    Attributes:
        keys: the prefix of the cached keys to lease (the rest is recomputed).
        plan: for ``cost_aware``, the decision and its estimates; else None.
    """

    keys: tuple[bytes, ...]
    plan: CostPlan | None = None


class LoadPolicy(abc.ABC):
    """How a load chooses the prefix it takes and how long it waits for promotion.

    A load runs ``resolve`` (fill the models the policy leaves open from the ones the engine declared),
    ``choose`` (which prefix of the cached keys to take) and leases that prefix, waiting ``wait_s`` for
    promotion; what is not ready by then is recomputed.
    """

    __slots__ = ()

    kind: ClassVar[LoadPolicyKind]

    def resolve(
        self, deadline: DeadlineModel | None = None, prefill: PrefillModel | None = None
    ) -> LoadPolicy:
        """This policy with the engine's declared models filling what it leaves open.

        Args:
            deadline: the deadline model declared for the namespace (used by an open ``timeout``).
            prefill: the prefill model declared for the namespace (used by an open ``cost_aware``).

        Raises:
            InvalidArgumentError: ``timeout_s`` for a timeout with no timeout and no deadline model anywhere;
                ``prefill`` for a cost-aware policy with no prefill model anywhere.
        """
        return self

    @abc.abstractmethod
    def wait_s(self, prompt_tokens: int) -> float | None:
        """How long promotion may be waited for a ``prompt_tokens``-long prompt: None = as long as it takes,
        0 = not at all (take what is ready now).

        Raises:
            InvalidArgumentError: ``timeout_s`` for an open timeout (resolve it first).
        """

    def choose(self, cached: Sequence[bytes], plan: Planner) -> LoadChoice:
        """The prefix of the chain's cached keys to load (default: all of them).

        Args:
            cached: the keys of the contiguous cached prefix.
            plan: estimates a cost-aware plan (only ``cost_aware`` calls it).

        Raises:
            InvalidArgumentError: ``prefill`` for an open cost-aware policy (resolve it first).
        """
        return LoadChoice(tuple(cached))

    @staticmethod
    def wait_complete() -> WaitComplete:
        """The whole cached prefix, however long it takes."""
        return WaitComplete()

    @staticmethod
    def best_effort() -> BestEffort:
        """Only what is in shared memory now."""
        return BestEffort()

    @staticmethod
    def timeout(timeout_s: float | None = None, deadline: DeadlineModel | None = None) -> Timeout:
        """What arrives within ``timeout_s``, or the ``deadline`` model's time for the prompt (neither: the
        deadline model declared for the namespace)."""
        return Timeout(timeout_s, deadline)

    @staticmethod
    def cost_aware(prefill: PrefillModel | None = None) -> CostAware:
        """Only the prefix worth loading under ``prefill`` (None: the prefill model declared for the
        namespace)."""
        return CostAware(prefill)


@dataclass(frozen=True, slots=True)
class WaitComplete(LoadPolicy):
    """The whole cached prefix, however long promotion out of the slower tiers takes."""

    kind: ClassVar[LoadPolicyKind] = LoadPolicyKind.WAIT_COMPLETE

    def wait_s(self, prompt_tokens: int) -> float | None:
        """As long as it takes."""
        return None


@dataclass(frozen=True, slots=True)
class BestEffort(LoadPolicy):
    """Only what is in the shared-memory tier now; promotions started for the load go on for the next one."""

    kind: ClassVar[LoadPolicyKind] = LoadPolicyKind.BEST_EFFORT

    def wait_s(self, prompt_tokens: int) -> float | None:
        """Not at all."""
        return 0.0


@dataclass(frozen=True, slots=True)
class Timeout(LoadPolicy):
    """What promotion brings within a deadline: ``timeout_s``, else the deadline model's value for the prompt.

    Attributes:
        timeout_s: the deadline in seconds (non-negative; 0 takes what is ready now); None: from ``deadline``.
        deadline: derives the deadline from the prompt length; None (with ``timeout_s`` None too): the
            deadline model declared for the namespace.
    """

    kind: ClassVar[LoadPolicyKind] = LoadPolicyKind.TIMEOUT
    timeout_s: float | None = None
    deadline: DeadlineModel | None = None

    def __post_init__(self) -> None:
        if self.timeout_s is not None:
            _non_negative("timeout_s", self.timeout_s)
        if self.deadline is not None and not isinstance(self.deadline, DeadlineModel):
            raise InvalidArgumentError("deadline", f"must be a DeadlineModel, got {self.deadline!r}")

    @property
    def open(self) -> bool:
        """True when the deadline is left to the model declared for the namespace."""
        return self.timeout_s is None and self.deadline is None

    def resolve(
        self, deadline: DeadlineModel | None = None, prefill: PrefillModel | None = None
    ) -> LoadPolicy:
        """This timeout, or the declared deadline model when it has neither timeout nor model of its own."""
        if not self.open:
            return self
        if deadline is None:
            raise InvalidArgumentError(
                "timeout_s", "the timeout policy needs timeout_s or a deadline model (its own or declared)"
            )
        return Timeout(deadline=deadline)

    def wait_s(self, prompt_tokens: int) -> float | None:
        """``timeout_s``, else the deadline model's value for ``prompt_tokens``."""
        if self.timeout_s is not None:
            return self.timeout_s
        if self.deadline is None:
            raise InvalidArgumentError("timeout_s", "an open timeout policy waits for the declared deadline")
        return self.deadline.deadline_s(prompt_tokens)


@dataclass(frozen=True, slots=True)
class CostAware(LoadPolicy):
    """Only the contiguous prefix whose estimated load beats recomputing it; that prefix is waited for.

    Attributes:
        prefill: the engine's prefill model; None: the one declared for the namespace.
    """

    kind: ClassVar[LoadPolicyKind] = LoadPolicyKind.COST_AWARE
    prefill: PrefillModel | None = None

    def __post_init__(self) -> None:
        if self.prefill is not None and not isinstance(self.prefill, PrefillModel):
            raise InvalidArgumentError("prefill", f"must be a PrefillModel, got {self.prefill!r}")

    def resolve(
        self, deadline: DeadlineModel | None = None, prefill: PrefillModel | None = None
    ) -> LoadPolicy:
        """This policy, with the declared prefill model when it has none of its own."""
        if self.prefill is not None:
            return self
        if prefill is None:
            raise InvalidArgumentError(
                "prefill", "the cost_aware policy needs the engine's prefill model (its own or declared)"
            )
        return CostAware(prefill)

    def wait_s(self, prompt_tokens: int) -> float | None:
        """The chosen prefix is worth its load: as long as it takes."""
        return None

    def choose(self, cached: Sequence[bytes], plan: Planner) -> LoadChoice:
        """The prefix with the largest estimated saving (see :func:`plan_cost_aware`)."""
        if self.prefill is None:
            raise InvalidArgumentError("prefill", "an open cost_aware policy plans with the declared model")
        decision = plan(cached, self.prefill)
        return LoadChoice(tuple(cached[: decision.chunks]), decision)


_Build = Callable[[float | None, DeadlineModel | None, PrefillModel | None], LoadPolicy]
"""Builds a policy from ``(timeout_s, deadline, prefill)``, taking the parameters it uses."""

_LOAD: dict[LoadPolicyKind, _Build] = {
    LoadPolicyKind.WAIT_COMPLETE: lambda _t, _d, _p: WaitComplete(),
    LoadPolicyKind.BEST_EFFORT: lambda _t, _d, _p: BestEffort(),
    LoadPolicyKind.TIMEOUT: lambda t, d, _p: Timeout(t, d),
    LoadPolicyKind.COST_AWARE: lambda _t, _d, p: CostAware(p),
}


def make_load_policy(
    kind: LoadPolicyKind | str,
    *,
    timeout_s: float | None = None,
    deadline: DeadlineModel | None = None,
    prefill: PrefillModel | None = None,
) -> LoadPolicy:
    """Build a load policy by kind or by its name; each policy takes the parameters it uses.

    Args:
        kind: the policy.
        timeout_s, deadline: for ``timeout`` (both None: the declared deadline model).
        prefill: for ``cost_aware`` (None: the declared prefill model).

    Raises:
        InvalidArgumentError: unknown name (``load_policy``; the message lists the valid ones) or a bad
            parameter.
    """
    return _LOAD[parse_kind(LoadPolicyKind, kind, "load_policy")](timeout_s, deadline, prefill)

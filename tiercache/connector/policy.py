"""How a load chooses what to take: the connector's load policies.

* ``wait_complete`` (default): the whole cached prefix, however long promotion out of L3 takes.
* ``best_effort``: only what is in the daemon's shared memory now.
* ``timeout``: wait for promotion up to ``timeout_s``, or the deadline model declared for the namespace.
* ``cost_aware``: only the prefix whose load the daemon estimates faster than recomputing it, from its
  measured tier rates and the prefill model declared for the namespace.

The core's :class:`~tiercache.policies.load.LoadRequest` is accepted too: its deadline model is evaluated here for
the prompt, and its prefill model is declared for the namespace (sent with the next registration).

Primitives:
    LoadPolicy: a policy and its timeout.
    WirePolicy: what AcquireLoad carries.
    to_wire: LoadPolicy | LoadRequest | None -> WirePolicy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import LoadPolicyKind, LoadRequest, PrefillModel


@dataclass(frozen=True, slots=True)
class LoadPolicy:
    """A load policy.

    Attributes:
        kind: the policy.
        timeout_s: for ``timeout``: the deadline in seconds; None: the deadline model declared for the
            namespace (``ConnectorConfig.deadline``).
    """

    kind: LoadPolicyKind = LoadPolicyKind.WAIT_COMPLETE
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, LoadPolicyKind):
            raise InvalidArgumentError("policy.kind", f"must be a LoadPolicyKind, got {self.kind!r}")
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or self.timeout_s <= 0
        ):
            raise InvalidArgumentError("policy.timeout_s", f"must be None or > 0, got {self.timeout_s!r}")

    @classmethod
    def wait_complete(cls) -> LoadPolicy:
        """The whole cached prefix, however long it takes."""
        return cls(LoadPolicyKind.WAIT_COMPLETE)

    @classmethod
    def best_effort(cls) -> LoadPolicy:
        """Only what is in shared memory now."""
        return cls(LoadPolicyKind.BEST_EFFORT)

    @classmethod
    def timeout(cls, timeout_s: float | None = None) -> LoadPolicy:
        """What arrives within ``timeout_s`` (None: the declared deadline model)."""
        return cls(LoadPolicyKind.TIMEOUT, timeout_s)

    @classmethod
    def cost_aware(cls) -> LoadPolicy:
        """Only the prefix worth loading (needs a declared prefill model)."""
        return cls(LoadPolicyKind.COST_AWARE)


@dataclass(frozen=True, slots=True)
class WirePolicy:
    """What AcquireLoad carries.

    Attributes:
        kind: the policy.
        timeout_s: the TIMEOUT deadline (0: the daemon uses the declared deadline model).
        prefill: a prefill model the request brought, to declare for the namespace (else None).
    """

    kind: LoadPolicyKind
    timeout_s: float
    prefill: PrefillModel | None = None


def to_wire(policy: LoadPolicy | LoadRequest | None, prompt_tokens: int) -> WirePolicy:
    """The wire form of a policy for a prompt of ``prompt_tokens`` tokens.

    Raises:
        InvalidArgumentError: not a policy.
    """
    if policy is None:
        return WirePolicy(LoadPolicyKind.WAIT_COMPLETE, 0.0)
    if isinstance(policy, LoadPolicy):
        return WirePolicy(policy.kind, policy.timeout_s or 0.0)
    if isinstance(policy, LoadRequest):
        if policy.kind is LoadPolicyKind.TIMEOUT:
            timeout = policy.wait_s(prompt_tokens) or 0.0
            if timeout <= 0:  # a deadline of 0 takes what is ready now
                return WirePolicy(LoadPolicyKind.BEST_EFFORT, 0.0, policy.prefill)
            return WirePolicy(policy.kind, timeout, policy.prefill)
        return WirePolicy(policy.kind, 0.0, policy.prefill)
    raise InvalidArgumentError("policy", f"must be a LoadPolicy or LoadRequest, got {type(policy).__name__}")

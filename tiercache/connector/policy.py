"""What AcquireLoad carries for a load policy: the core's :class:`~tiercache.policies.load.LoadPolicy` on
the wire.

The connector takes the core's policies (``LoadPolicy.best_effort()``, ``LoadPolicy.timeout(0.5)``, ...).
A timeout with its own deadline model is evaluated here for the prompt; an open timeout or cost-aware policy
is left to the models declared for the namespace (the daemon resolves it); a cost-aware policy that brings
its own prefill model declares it for the namespace (sent with the next registration).

Primitives:
    WirePolicy: what AcquireLoad carries.
    to_wire: LoadPolicy | None -> WirePolicy.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.policies.load import CostAware, LoadPolicy, LoadPolicyKind, PrefillModel, Timeout


@dataclass(frozen=True, slots=True)
class WirePolicy:
    """What AcquireLoad carries.

    Attributes:
        kind: the policy.
        timeout_s: the TIMEOUT deadline (0: the daemon uses the declared deadline model).
        prefill: a prefill model the policy brought, to declare for the namespace (else None).
    """

    kind: LoadPolicyKind
    timeout_s: float
    prefill: PrefillModel | None = None


def to_wire(policy: LoadPolicy | None, prompt_tokens: int) -> WirePolicy:
    """The wire form of a policy (None: wait_complete) for a prompt of ``prompt_tokens`` tokens.

    Raises:
        InvalidArgumentError: not a load policy.
    """
    if policy is None:
        return WirePolicy(LoadPolicyKind.WAIT_COMPLETE, 0.0)
    if not isinstance(policy, LoadPolicy):
        raise InvalidArgumentError("policy", f"must be a LoadPolicy, got {type(policy).__name__}")
    if isinstance(policy, Timeout) and not policy.open:
        timeout = policy.wait_s(prompt_tokens) or 0.0
        if timeout <= 0:  # a deadline of 0 takes what is ready now (0 on the wire means: declared model)
            return WirePolicy(LoadPolicyKind.BEST_EFFORT, 0.0)
        return WirePolicy(policy.kind, timeout)
    prefill = policy.prefill if isinstance(policy, CostAware) else None
    return WirePolicy(policy.kind, 0.0, prefill)

"""Who owns what: the tenant of each handle, and the handle of each store ticket, load lease and prefill claim.

A handle is the cache manager's tenant-scoped namespace id. The daemon remembers which tenant registered it
so that a handle presented by another tenant is refused (NOT_FOUND, as one nobody registered), and which
handle each ticket or lease was taken under so that one engine cannot commit or release another namespace's
work. The maps live in memory: after a restart engines register again (and get the same handle bytes, since
ids are deterministic).

A handle also carries the cost models its engines declared at registration (the prefill model for cost-aware
loads, the deadline model for timeout loads). Engines of one namespace share a handle: a registration that
declares a model replaces the handle's model, one that declares none keeps the model declared before.

Both classes are used from the event loop only (no locks).

Primitives:
    HandleInfo: the tenant, chunk size and declared cost models of a handle.
    HandleRegistry: ``admit(handle, tenant)`` (the tenant's cap of namespaces), ``add(handle, tenant,
        chunk_bytes, ...)``, ``owner(handle)``, ``check(handle, tenant)``.
    Claims: ticket or lease id -> (handle, expiry); ``add``, ``take``, ``owned``, ``lapsed`` (a claim
        forgotten after its expiry, remembered for a clear refusal of a late commit).
    Owners: id -> handle for ids without a fixed expiry (prefill claims), bounded per tenant, each tenant's
        oldest forgotten first (one tenant's claims never push out another's).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError, NotFoundError
from tiercache.keys import NAMESPACE_ID_BYTES
from tiercache.policies.load import DeadlineModel, PrefillModel

from .fairness import FairShares

EXPIRY_GRACE_S = 5.0
"""A claim is forgotten this long after the manager's own expiry of the ticket or lease."""
LAPSED_REMEMBERED = 65_536
"""Forgotten (expired) claims whose ids are still remembered, so that a late use is told it expired."""


@dataclass(frozen=True, slots=True)
class HandleInfo:
    """What the daemon remembers of a handle.

    Attributes:
        tenant: the tenant that registered it.
        chunk_bytes: the chunk size of its namespace's layout.
        chunk_tokens: tokens per chunk of its namespace's layout.
        prefill: the engines' declared prefill model (cost-aware loads), None when none was declared.
        deadline: the engines' declared load-deadline model (timeout loads), None when none was declared.
    """

    tenant: str
    chunk_bytes: int
    chunk_tokens: int = 0
    prefill: PrefillModel | None = None
    deadline: DeadlineModel | None = None


class HandleRegistry:
    """The tenant of every handle registered since the daemon started, at most ``shares.namespaces`` each."""

    def __init__(self, shares: FairShares | None = None) -> None:
        """Args: shares: the per-tenant caps (default :class:`~.fairness.FairShares`)."""
        self._shares = shares or FairShares()
        self._owners: dict[bytes, HandleInfo] = {}
        self._count: dict[str, int] = {}

    def admit(self, handle: bytes, tenant: str) -> None:
        """Check, before a registration, that ``tenant`` may hold ``handle`` (one it holds, or one more).

        Raises:
            QuotaExceededError: the tenant holds its cap of namespaces (``namespaces``).
        """
        info = self._owners.get(handle)
        held = self._count.get(tenant, 0)
        if (info is None or info.tenant != tenant) and held >= self._shares.namespaces:
            raise self._shares.refuse(tenant, "namespaces", f"the tenant registered {held} already")

    def add(
        self,
        handle: bytes,
        tenant: str,
        chunk_bytes: int,
        chunk_tokens: int = 0,
        prefill: PrefillModel | None = None,
        deadline: DeadlineModel | None = None,
    ) -> HandleInfo:
        """Record that ``tenant`` registered ``handle`` (idempotent); returns what is now known of it.

        A model that is None keeps the one an earlier registration of the handle declared.
        """
        old = self._owners.get(handle)
        if old is not None and old.tenant == tenant:
            prefill = prefill or old.prefill
            deadline = deadline or old.deadline
        info = HandleInfo(tenant, chunk_bytes, chunk_tokens, prefill, deadline)
        if old is None or old.tenant != tenant:
            self._count[tenant] = self._count.get(tenant, 0) + 1
        self._owners[handle] = info
        return info

    def owner(self, handle: bytes) -> str | None:
        """The tenant that registered ``handle``, None when nobody has since start."""
        info = self._owners.get(handle)
        return None if info is None else info.tenant

    def __len__(self) -> int:
        return len(self._owners)

    def check(self, handle: bytes, tenant: str, field: str = "handle") -> HandleInfo:
        """What is known of ``handle`` if ``tenant`` registered it.

        Raises:
            InvalidArgumentError: not a handle (wrong length).
            NotFoundError: ``tenant`` has not registered it since the daemon started (another tenant's
                handle gets the very same answer as one nobody registered: whether another tenant
                registered a namespace, such as a model or LoRA, is not the caller's to learn).
        """
        if len(handle) != NAMESPACE_ID_BYTES:
            raise InvalidArgumentError(
                field,
                f"must be the {NAMESPACE_ID_BYTES}-byte handle Register returned, got {len(handle)} bytes",
            )
        info = self._owners.get(handle)
        if info is None or info.tenant != tenant:  # one answer: another tenant's handle tells nothing
            raise NotFoundError(
                field,
                f"{handle.hex()} is not registered (call Register first; after a daemon restart, register again)",
            )
        return info


@dataclass(frozen=True, slots=True)
class _Claim:
    handle: bytes
    forget_at: float
    expires_at: float


class Claims:
    """Ticket or lease ids taken under a handle, forgotten a little after they expire in the manager."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Args: clock: the cache manager's clock (expiry times are in its seconds)."""
        self._clock = clock
        self._claims: dict[int, _Claim] = {}
        self._lapsed: OrderedDict[int, _Claim] = OrderedDict()

    def add(self, ident: int, handle: bytes, expires_at: float) -> None:
        """Record that ``ident`` was taken under ``handle``; forget long-expired claims."""
        now = self._clock()
        for old in [i for i, c in self._claims.items() if c.forget_at <= now]:
            self._lapsed[old] = self._claims.pop(old)
        while len(self._lapsed) > LAPSED_REMEMBERED:
            self._lapsed.popitem(last=False)
        self._claims[ident] = _Claim(handle, expires_at + EXPIRY_GRACE_S, expires_at)

    def lapsed(self, ident: int, handle: bytes) -> float | None:
        """When ``ident``, a claim of ``handle`` forgotten after its expiry, expired; None otherwise."""
        claim = self._lapsed.get(ident)
        return claim.expires_at if claim is not None and claim.handle == handle else None

    def owned(self, ident: int, handle: bytes) -> bool:
        """Whether ``ident`` is a live claim of ``handle``."""
        claim = self._claims.get(ident)
        return claim is not None and claim.handle == handle

    def take(self, ident: int, handle: bytes) -> bool:
        """Remove and return True when ``ident`` is a claim of ``handle``; False (nothing removed) otherwise."""
        if not self.owned(ident, handle):
            return False
        del self._claims[ident]
        return True

    def __len__(self) -> int:
        return len(self._claims)


class Owners:
    """Ids taken under a handle whose lifetime the daemon does not know (a prefill claim is renewed by each
    publication); at most ``capacity`` per tenant are remembered, each tenant's oldest forgotten first."""

    def __init__(self, capacity: int = FairShares().prefill_claims) -> None:
        """Args: capacity: ids remembered at most per tenant."""
        self._capacity = capacity
        self._owners: dict[str, OrderedDict[int, bytes]] = {}
        self._tenant: dict[int, str] = {}

    def add(self, ident: int, handle: bytes, tenant: str = "") -> None:
        """Record that ``ident`` was taken under ``handle`` by ``tenant``."""
        own = self._owners.setdefault(tenant, OrderedDict())
        own[ident] = handle
        self._tenant[ident] = tenant
        while len(own) > self._capacity:
            old, _ = own.popitem(last=False)
            del self._tenant[old]

    def owned(self, ident: int, handle: bytes) -> bool:
        """Whether ``ident`` is remembered as taken under ``handle``."""
        tenant = self._tenant.get(ident)
        return tenant is not None and self._owners[tenant].get(ident) == handle

    def discard(self, ident: int) -> None:
        """Forget ``ident``."""
        tenant = self._tenant.pop(ident, None)
        if tenant is not None:
            del self._owners[tenant][ident]

    def __len__(self) -> int:
        return len(self._tenant)

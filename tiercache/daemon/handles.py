"""Who owns what: the tenant of each handle, and the handle of each store ticket, load lease and prefill claim.

A handle is the cache manager's tenant-scoped namespace id. The daemon remembers which tenant registered it
so that a handle presented by another tenant is refused, and which handle each ticket or lease was taken
under so that one engine cannot commit or release another namespace's work. The maps live in memory: after a
restart engines register again (and get the same handle bytes, since ids are deterministic).

A handle also carries the cost models its engines declared at registration (the prefill model for cost-aware
loads, the deadline model for timeout loads). Engines of one namespace share a handle: a registration that
declares a model replaces the handle's model, one that declares none keeps the model declared before.

Both classes are used from the event loop only (no locks).

Primitives:
    HandleInfo: the tenant, chunk size and declared cost models of a handle.
    HandleRegistry: ``add(handle, tenant, chunk_bytes, ...)``, ``owner(handle)``, ``check(handle, tenant)``.
    Claims: ticket or lease id -> (handle, expiry); ``add``, ``take``, ``owned``, ``lapsed`` (a claim
        forgotten after its expiry, remembered for a clear refusal of a late commit).
    Owners: id -> handle for ids without a fixed expiry (prefill claims), bounded, oldest forgotten first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from tiercache.keys import NAMESPACE_ID_BYTES
from tiercache.policies.load import DeadlineModel, PrefillModel

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
    """The tenant of every handle registered since the daemon started."""

    def __init__(self) -> None:
        """Start empty."""
        self._owners: dict[bytes, HandleInfo] = {}

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
            NotFoundError: nobody registered it since the daemon started.
            PermissionDeniedError: another tenant registered it.
        """
        if len(handle) != NAMESPACE_ID_BYTES:
            raise InvalidArgumentError(
                field,
                f"must be the {NAMESPACE_ID_BYTES}-byte handle Register returned, got {len(handle)} bytes",
            )
        info = self._owners.get(handle)
        if info is None:
            raise NotFoundError(
                field,
                f"{handle.hex()} is not registered (call Register first; after a daemon restart, register again)",
            )
        if info.tenant != tenant:
            raise PermissionDeniedError(f"{field}: {handle.hex()} belongs to another tenant")
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
    publication); at most ``capacity`` are remembered, the oldest are forgotten first."""

    def __init__(self, capacity: int = 65_536) -> None:
        """Args: capacity: ids remembered at most."""
        self._capacity = capacity
        self._owners: OrderedDict[int, bytes] = OrderedDict()

    def add(self, ident: int, handle: bytes) -> None:
        """Record that ``ident`` was taken under ``handle``."""
        self._owners[ident] = handle
        while len(self._owners) > self._capacity:
            self._owners.popitem(last=False)

    def owned(self, ident: int, handle: bytes) -> bool:
        """Whether ``ident`` is remembered as taken under ``handle``."""
        return self._owners.get(ident) == handle

    def discard(self, ident: int) -> None:
        """Forget ``ident``."""
        self._owners.pop(ident, None)

    def __len__(self) -> int:
        return len(self._owners)

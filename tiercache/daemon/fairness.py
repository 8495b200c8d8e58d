"""Fair shares of the daemon's own resources: what one tenant may hold at once, so that none starves another.

Byte quotas (:mod:`tiercache.cache.quotas`) bound what a tenant stores; these bound what it *holds while it
waits or streams*: threads blocked in long waits, open streams, event subscriptions, prefill claims,
running prefetches and registered namespaces. Each is capped per tenant (without tokens, every caller is
tenant ``""``), and a call beyond a cap is refused at once with RESOURCE_EXHAUSTED naming it (``quota
waits = 32 of tenant 'team-b' reached``), so the tenant learns it holds too much instead of waiting behind
itself.

Long waits (WaitPrefill, an AcquireLoad that waits for promotions) hold a thread each. They run in a pool of
their caller's tenant, of at most :attr:`FairShares.waits` threads: a tenant's waits can only ever wait
for its own, never take the threads another tenant's calls need. (One shared pool of 32 threads let 32
WaitPrefill calls of one tenant, up to 60 s each, hold a 0.01 s call of another for 10.8 s.)

Tables every tenant adds to and the daemon bounds (prefill claim owners, running prefetches) are bounded per
tenant by the same figures: a tenant that fills its part forgets its own oldest entries, never another's.

Everything but the wait pools runs on the event loop (no locks); the pools' counts are thread-safe.

Primitives:
    FairShares: the per-tenant caps (frozen; daemon options ``--tenant-waits``, ...).
    TenantWaits: ``executor(tenant)`` (capped, one pool per tenant), ``shutdown``.
    Holdings: ``hold(tenant, what)`` (a context: one stream or subscription).
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import ParamSpec, TypeVar

from tiercache.cache.quotas import QuotaExceededError
from tiercache.errors import InvalidArgumentError
from tiercache.options import option
from tiercache.parsers import parse_int

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class FairShares:
    """What one tenant may hold at once (each at least 1); each a daemon option (``--tenant-waits``, ...).

    Attributes:
        waits: calls blocked in a long wait (WaitPrefill, AcquireLoad waiting for promotions): as many as
            the one pool all tenants shared had threads, so that a lone tenant waits as it did.
        streams: open streams (StreamStore, StreamLoad, WatchEvents, Diagnostics streams).
        subscriptions: open WatchEvents subscriptions.
        prefill_claims: prefill claims remembered (the oldest of the tenant's are forgotten first).
        prefetches: running prefetches remembered for CancelPrefetch (the tenant's oldest go first).
        namespaces: handles registered (a model, revision or LoRA adapter each).
    """

    waits: int = option(
        "tenant_waits",
        parse=parse_int,
        help="long waits (WaitPrefill, loads waiting for promotions) one tenant may have running at once, each "
        "on a thread of the tenant's own pool; more are refused with RESOURCE_EXHAUSTED",
        metavar="INT",
        default=32,
    )
    streams: int = option(
        "tenant_streams",
        parse=parse_int,
        help="streams (StreamStore, StreamLoad, WatchEvents, Diagnostics) one tenant may have open at once",
        metavar="INT",
        default=256,
    )
    subscriptions: int = option(
        "tenant_subscriptions",
        parse=parse_int,
        help="WatchEvents subscriptions one tenant may have open at once",
        metavar="INT",
        default=16,
    )
    prefill_claims: int = option(
        "tenant_prefill_claims",
        parse=parse_int,
        help="prefill claims remembered per tenant (beyond it the tenant's oldest are forgotten: their waits "
        "and releases answer as for an unknown claim)",
        metavar="INT",
        default=4096,
    )
    prefetches: int = option(
        "tenant_prefetches",
        parse=parse_int,
        help="running prefetches remembered per tenant for CancelPrefetch (beyond it the tenant's oldest can "
        "no longer be cancelled)",
        metavar="INT",
        default=1024,
    )
    namespaces: int = option(
        "tenant_namespaces",
        parse=parse_int,
        help="namespaces (model, revision, LoRA adapter) one tenant may register",
        metavar="INT",
        default=1024,
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f.name, f"must be a positive integer, got {value!r}")

    def refuse(self, tenant: str, what: str, detail: str) -> QuotaExceededError:
        """The error of a call beyond cap ``what`` (RESOURCE_EXHAUSTED naming it and its value)."""
        return QuotaExceededError(tenant, what, getattr(self, what), detail)


class _TenantPool(Executor):
    """One tenant's wait threads: a submit beyond its cap is refused, never queued."""

    def __init__(self, tenant: str, shares: FairShares) -> None:
        self._tenant = tenant
        self._shares = shares
        self._lock = threading.Lock()
        self._running = 0
        name = f"tiercache-wait-{tenant or 'default'}"
        self._pool = ThreadPoolExecutor(max_workers=shares.waits, thread_name_prefix=name)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn`` on one of the tenant's threads.

        Raises:
            QuotaExceededError: the tenant has :attr:`FairShares.waits` waits running already.
        """
        with self._lock:
            if self._running >= self._shares.waits:
                raise self._shares.refuse(
                    self._tenant, "waits", f"{self._running} calls of the tenant are waiting already"
                )
            self._running += 1
        try:
            fut = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._done(None)
            raise
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: object) -> None:
        with self._lock:
            self._running -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


class TenantWaits:
    """A capped pool of wait threads per tenant (made on its first wait). Thread-safe."""

    def __init__(self, shares: FairShares | None = None) -> None:
        """Args: shares: the caps (default :class:`FairShares`)."""
        self.shares = shares or FairShares()
        self._lock = threading.Lock()
        self._pools: dict[str, _TenantPool] = {}

    def executor(self, tenant: str) -> Executor:
        """The tenant's pool (its ``submit`` raises QuotaExceededError beyond the tenant's waits)."""
        with self._lock:
            pool = self._pools.get(tenant)
            if pool is None:
                pool = self._pools[tenant] = _TenantPool(tenant, self.shares)
            return pool

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut every pool down (the executor protocol's shutdown)."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.shutdown(wait, cancel_futures=cancel_futures)


class Holdings:
    """Per-tenant counts of what calls hold while they run (streams, subscriptions), capped (event loop)."""

    def __init__(self, shares: FairShares | None = None) -> None:
        """Args: shares: the caps (default :class:`FairShares`)."""
        self.shares = shares or FairShares()
        self._held: dict[tuple[str, str], int] = defaultdict(int)

    @contextlib.contextmanager
    def hold(self, tenant: str, what: str) -> Iterator[None]:
        """Hold one of ``what`` (a field of :class:`FairShares`) for the tenant while the context runs.

        Raises:
            QuotaExceededError: the tenant holds its cap of ``what`` already.
        """
        key = (tenant, what)
        held = self._held.get(key, 0)
        if held >= getattr(self.shares, what):
            raise self.shares.refuse(tenant, what, f"the tenant has {held} open already")
        self._held[key] = held + 1
        try:
            yield
        finally:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

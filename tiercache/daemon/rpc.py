"""What every handler of the daemon's servicers shares: the caller, the executors, and the RPC decorators.

A handler only translates: request -> core call -> response. Everything before and around it is here. The
decorators authenticate the call (the tenant of its bearer token), resolve the request's ``handle`` to the
caller's namespace id — refusing a malformed handle (INVALID_ARGUMENT), and one the caller did not register
(NOT_FOUND: another tenant's handle gets the answer of one nobody registered) — and only then call the
handler with the resolved :class:`Caller`, so that no handler runs for an unauthenticated call or with a
handle that is not its caller's. An exception escaping a handler becomes the status of a tiercache error
(:mod:`.status`), anything else INTERNAL; every RPC's latency and status code is recorded
(:meth:`ServicerBase.observe`).

Blocking cache calls run in the executor, never on the event loop; calls that may block for long (promotion
waits, prefill waits) in their tenant's capped wait pool, so that they cannot take every thread the short
calls need, nor another tenant's (:mod:`.fairness`). A tenant's open response streams are capped the same
way.

Primitives:
    DataPlaneInfo: the shared-memory segment engines map.
    ServiceDeps: what the servicers need (manager, executors, auth, handles, events, metrics, limits).
    Caller: an authenticated caller and its checked handle.
    ServicerBase: ``resolve``, ``run``, ``run_long``, ``fire``, ``expires_in``, ``observe``.
    unary, server_stream: decorators of handlers that take the request's handle (get a Caller).
    unary_tenant, server_stream_tenant: decorators of handlers that take no handle (get the tenant).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, NoReturn, ParamSpec, Protocol, TypeVar

import grpc

from tiercache.cache import CacheManager
from tiercache.cache.rules import EngineRules
from tiercache.errors import TierCacheError

from .auth import Authenticator
from .config import StreamConfig
from .events import EventHub
from .fairness import Holdings, TenantWaits
from .fdserver import TenantPools
from .handles import HandleInfo, HandleRegistry
from .metrics import DaemonMetrics
from .status import abort_with, status_of

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
W = TypeVar("W")
S = TypeVar("S", bound="ServicerBase")
Req = TypeVar("Req")
HReq = TypeVar("HReq", bound="HandleRequest")
Resp = TypeVar("Resp")


@dataclass(frozen=True, slots=True)
class DataPlaneInfo:
    """The shared-memory segment of the L2 tier.

    Attributes:
        segment: name under ``/dev/shm`` (the default tenant's pool).
        slot_bytes: bytes per slot; slot ``i`` starts at ``i * slot_bytes``.
        num_slots: slots in the segment.
        pools: with tokens and a unix socket, every tenant's own pool, handed out by file descriptor (the
            isolated data plane); None: every engine maps ``segment``.
        max_chunk_bytes: the largest chunk, which may span several slots (pages) from its first; 0: one.
        segment_bytes: bytes of each pool's segment (0: its slots only).
        index_entries: entries of the index each pool publishes after its slots (0: none).
    """

    segment: str
    slot_bytes: int
    num_slots: int
    pools: TenantPools | None = None
    max_chunk_bytes: int = 0
    segment_bytes: int = 0
    index_entries: int = 0


@dataclass(frozen=True, slots=True)
class ServiceDeps:
    """What the servicers work with.

    Attributes:
        manager: the cache.
        executor: where blocking manager calls run.
        auth: caller -> tenant.
        handles: handle -> tenant and chunk size.
        events: the event hub.
        metrics: RPC and byte counters.
        data_plane: the shared-memory segment.
        stream: message limits.
        lease_ttl_s: the default lease and ticket lifetime.
        clock: the manager's clock (expiry times are in its seconds).
        wait_executor: where calls that may block for long run (promotion waits, prefill waits): a capped
            pool per tenant (:mod:`.fairness`).
        holdings: what each tenant's calls hold (streams, subscriptions), capped per tenant.
        max_ttl_s: the longest lease and ticket lifetime a request may ask for (0: not known).
        control_socket: where the unary calls are also served without gRPC (:mod:`.control`); "": nowhere.
        quotas_active: whether any tenant has quotas (a commit may then trim, and so demote: never on the loop).
    """

    manager: CacheManager
    executor: Executor
    auth: Authenticator
    handles: HandleRegistry
    events: EventHub
    metrics: DaemonMetrics
    data_plane: DataPlaneInfo
    stream: StreamConfig
    lease_ttl_s: float
    clock: Callable[[], float] = time.monotonic
    wait_executor: TenantWaits = field(default_factory=TenantWaits)
    holdings: Holdings = field(default_factory=Holdings)
    max_ttl_s: float = 0.0
    control_socket: str = ""
    quotas_active: bool = False


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller whose request's handle is its own.

    Attributes:
        tenant: the tenant of the call's token.
        namespace_id: the handle: the cache manager's tenant-scoped namespace id.
        info: what the daemon knows of the handle (chunk size, declared cost models).
    """

    tenant: str
    namespace_id: bytes
    info: HandleInfo


class HandleRequest(Protocol):
    """A request that names a registered namespace by its handle."""

    @property
    def handle(self) -> bytes:
        """The handle Register returned."""
        ...


class ServicerBase:
    """Shared plumbing of the servicers: the caller, executor calls, background work, RPC metrics."""

    def __init__(self, deps: ServiceDeps) -> None:
        """Args: deps: what the servicer works with."""
        self._deps = deps
        self._manager = deps.manager
        self._rules = EngineRules(deps.manager)
        self._background: set[Future[Any]] = set()

    def tenant(self, context: Any) -> str:
        """The tenant of a call (``context`` is its ``grpc.aio.ServicerContext``).

        Raises:
            UnauthenticatedError: a missing, malformed or unknown token (authentication on).
        """
        return self._deps.auth.tenant(context.invocation_metadata())

    def resolve(self, tenant: str, handle: bytes) -> Caller:
        """Check that ``handle`` is one ``tenant`` registered.

        Raises:
            InvalidArgumentError: not a handle (``handle``: wrong length).
            NotFoundError: ``tenant`` did not register it (nobody did, or another tenant did).
        """
        return Caller(tenant, handle, self._deps.handles.check(handle, tenant))

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """Record one finished RPC."""
        self._deps.metrics.observe_rpc(method, code.name, seconds)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call in the executor and wait for it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._deps.executor, functools.partial(fn, *args, **kwargs))

    async def run_long(self, tenant: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a call that may block for long in the tenant's wait pool and wait for it.

        Raises:
            QuotaExceededError: the tenant has its cap of waits running (:mod:`.fairness`).
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.long_executor(tenant), functools.partial(fn, *args, **kwargs))

    def long_executor(self, tenant: str) -> Executor:
        """Where a tenant's calls that may block for long run (its submit refuses beyond the tenant's cap)."""
        return self._deps.wait_executor.executor(tenant)

    def fire(self, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> Future[Any]:
        """Start a blocking call in the executor without waiting; failures are logged."""
        fut: Future[Any] = self._deps.executor.submit(fn, *args, **kwargs)
        self._background.add(fut)
        fut.add_done_callback(self._background_done)
        return fut

    def _background_done(self, fut: Future[Any]) -> None:
        self._background.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("background cache call failed: %s", fut.exception())

    def expires_in(self, expires_at: float) -> float:
        """Seconds from now (the manager's clock) until ``expires_at``, at least 0."""
        return max(0.0, expires_at - self._deps.clock())


async def _fail(name: str, exc: BaseException, context: Any) -> NoReturn:
    """Abort the call for an exception escaping a handler (the status of a tiercache error, else INTERNAL)."""
    if isinstance(exc, TierCacheError):
        logger.debug("%s -> %s: %s", name, status_of(exc)[0].name, exc)
        await abort_with(context, exc)
    logger.error("%s failed", name, exc_info=exc)
    await context.abort(
        grpc.StatusCode.INTERNAL, f"internal error in {name}: {type(exc).__name__}; see the daemon log"
    )
    raise AssertionError("context.abort returned")  # pragma: no cover


def _code_of(exc: Exception) -> grpc.StatusCode:
    return status_of(exc)[0] if isinstance(exc, TierCacheError) else grpc.StatusCode.INTERNAL


def _by_tenant(servicer: ServicerBase, request: object, context: Any) -> str:
    return servicer.tenant(context)


def _by_handle(servicer: ServicerBase, request: HandleRequest, context: Any) -> Caller:
    return servicer.resolve(servicer.tenant(context), request.handle)


def _unary(
    method: Callable[[S, Req, W, Any], Awaitable[Resp]], who: Callable[[S, Req, Any], W]
) -> Callable[[S, Req, Any], Awaitable[Resp]]:
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: S, request: Req, context: Any) -> Resp:
        start, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            return await method(self, request, who(self, request, context), context)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            code = grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            code = _code_of(exc)
            await _fail(name, exc, context)
        finally:
            self.observe(name, code, time.perf_counter() - start)

    return handler


def _server_stream(
    method: Callable[[S, Req, W, Any], AsyncIterator[Resp]], who: Callable[[S, Req, Any], W]
) -> Callable[[S, Req, Any], AsyncIterator[Resp]]:
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: S, request: Req, context: Any) -> AsyncIterator[Resp]:
        start, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            caller = who(self, request, context)
            tenant = caller.tenant if isinstance(caller, Caller) else str(caller)
            with self._deps.holdings.hold(tenant, "streams"):
                async for item in method(self, request, caller, context):
                    yield item
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            code = grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            code = _code_of(exc)
            await _fail(name, exc, context)
        finally:
            self.observe(name, code, time.perf_counter() - start)

    return handler


def unary(
    method: Callable[[S, HReq, Caller, Any], Awaitable[Resp]],
) -> Callable[[S, HReq, Any], Awaitable[Resp]]:
    """Wrap a unary-response handler of a request with a ``handle``: it gets the resolved :class:`Caller`."""
    return _unary(method, _by_handle)


def unary_tenant(
    method: Callable[[S, Req, str, Any], Awaitable[Resp]],
) -> Callable[[S, Req, Any], Awaitable[Resp]]:
    """Wrap a unary-response handler of a request without a handle: it gets the authenticated tenant."""
    return _unary(method, _by_tenant)


def server_stream(
    method: Callable[[S, HReq, Caller, Any], AsyncIterator[Resp]],
) -> Callable[[S, HReq, Any], AsyncIterator[Resp]]:
    """Wrap a response-streaming handler of a request with a ``handle``: it gets the resolved Caller."""
    return _server_stream(method, _by_handle)


def server_stream_tenant(
    method: Callable[[S, Req, str, Any], AsyncIterator[Resp]],
) -> Callable[[S, Req, Any], AsyncIterator[Resp]]:
    """Wrap a response-streaming handler of a request without a handle: it gets the authenticated tenant."""
    return _server_stream(method, _by_tenant)

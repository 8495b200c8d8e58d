"""The gRPC servicers: ``tiercache.v1.KVCacheService`` and ``tiercache.v1.Diagnostics``.

They only translate: authenticate the caller, check that a handle is the caller's, convert the request
(:mod:`.convert`), run the cache manager's blocking call in the executor (never on the event loop), convert
the result. Errors are tiercache exceptions, turned into statuses by :mod:`.status`; every RPC's latency and
status code is recorded in :mod:`.metrics`.

Engines store into and load from L2, the shared-memory tier named in ``RegisterResponse.data_plane``.

Calls that may block for long — loads that wait for promotion out of a slow L3 and single-flight prefill
waits, which last until another engine publishes — run in a separate, bounded executor
(``ServiceDeps.wait_executor``), so that they cannot take every thread of the executor the short calls
(Stats, Register, stores, releases) need. Load policies are resolved in :mod:`.loads`; running prefetches
are kept by id in :mod:`.prefetches` so that they can be cancelled.

Primitives:
    DataPlaneInfo: the shared-memory segment engines map.
    ServiceDeps: what the servicers need (manager, executor, auth, handles, events, metrics, limits).
    KVCacheServicer, DiagnosticsServicer: the servicers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, NoReturn, ParamSpec, TypeVar

import grpc
import zstandard

from tiercache.cache import CacheManager, StoreTicket
from tiercache.errors import CapacityError, InvalidArgumentError, NotFoundError, TierCacheError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.stats_wire import stats_to_proto
from tiercache.tiers.base import TierLevel

from . import convert
from .auth import Authenticator
from .config import StreamConfig
from .events import EventHub, HubEvent, HubEventKind
from .handles import Claims, HandleRegistry, Owners
from .loads import LoadOutcome, resolve_policy, run_load
from .metrics import DaemonMetrics
from .prefetches import PrefetchTable
from .status import abort_with, status_of
from .streams import INLINE_BYTES, LOAD_ZSTD_LEVEL, ChunkAssembler, encode_piece

logger = logging.getLogger(__name__)

SHM = TierLevel.L2
"""The tier engines reach through shared memory."""
FASTEST = TierLevel.L1
"""The device tier, filled with chunks engines load (when the daemon has one)."""
MAX_PREFILL_WAIT_S = 60.0
"""A WaitPrefill waits at most this long, whatever its timeout_s: a wait holds a thread, and a draining
daemon lets the waits in flight end before it exits."""

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="_Translating")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True, slots=True)
class DataPlaneInfo:
    """The shared-memory segment of the L2 tier.

    Attributes:
        segment: name under ``/dev/shm``.
        slot_bytes: bytes per slot; slot ``i`` starts at ``i * slot_bytes``.
        num_slots: slots in the segment.
    """

    segment: str
    slot_bytes: int
    num_slots: int


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
        wait_executor: where calls that may block for long run (promotion waits, prefill waits); None:
            ``executor``.
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
    wait_executor: Executor | None = None


class _Translating:
    """Shared plumbing: the caller's tenant, executor calls, background work."""

    def __init__(self, deps: ServiceDeps) -> None:
        self._deps = deps
        self._background: set[Future[Any]] = set()

    def _tenant(self, context: Any) -> str:
        return self._deps.auth.tenant(context.invocation_metadata())

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking call in the executor and wait for it."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._deps.executor, functools.partial(fn, *args, **kwargs))

    async def _run_long(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a call that may block for long in the wait executor and wait for it."""
        loop = asyncio.get_running_loop()
        executor = self._deps.wait_executor or self._deps.executor
        return await loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))

    def _fire(self, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> Future[Any]:
        """Start a blocking call in the executor without waiting; failures are logged."""
        fut: Future[Any] = self._deps.executor.submit(fn, *args, **kwargs)
        self._background.add(fut)
        fut.add_done_callback(self._background_done)
        return fut

    def _background_done(self, fut: Future[Any]) -> None:
        self._background.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("background cache call failed: %s", fut.exception())


def _finish(metrics: DaemonMetrics, name: str, start: float, code: grpc.StatusCode) -> None:
    metrics.observe_rpc(name, code.name, time.perf_counter() - start)


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


def unary(
    method: Callable[[S, Req, Any], Awaitable[Resp]],
) -> Callable[[S, Req, Any], Awaitable[Resp]]:
    """Wrap a unary-response handler: errors become statuses, latency is recorded."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: S, request: Req, context: Any) -> Resp:
        start, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            return await method(self, request, context)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            code = grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            code = status_of(exc)[0] if isinstance(exc, TierCacheError) else grpc.StatusCode.INTERNAL
            await _fail(name, exc, context)
        finally:
            _finish(self._deps.metrics, name, start, code)

    return handler


def server_stream(
    method: Callable[[S, Req, Any], AsyncIterator[Resp]],
) -> Callable[[S, Req, Any], AsyncIterator[Resp]]:
    """Wrap a response-streaming handler: errors become statuses, latency is recorded."""
    name = method.__name__

    @functools.wraps(method)
    async def handler(self: S, request: Req, context: Any) -> AsyncIterator[Resp]:
        start, code = time.perf_counter(), grpc.StatusCode.OK
        try:
            async for item in method(self, request, context):
                yield item
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            code = grpc.StatusCode.UNKNOWN
            raise
        except Exception as exc:
            code = status_of(exc)[0] if isinstance(exc, TierCacheError) else grpc.StatusCode.INTERNAL
            await _fail(name, exc, context)
        finally:
            _finish(self._deps.metrics, name, start, code)

    return handler


class KVCacheServicer(pb_grpc.KVCacheServiceServicer, _Translating):
    """``tiercache.v1.KVCacheService`` over a :class:`~tiercache.cache.manager.CacheManager`."""

    def __init__(self, deps: ServiceDeps) -> None:
        """Args: deps: what the servicer works with."""
        _Translating.__init__(self, deps)
        self._manager = deps.manager
        self._tickets = Claims(deps.clock)
        self._leases = Claims(deps.clock)
        self._claims = Owners()
        self._prefetches = PrefetchTable()

    def _handle(self, handle: bytes, tenant: str) -> int:
        """Check the caller's handle; returns its chunk size."""
        return self._deps.handles.check(handle, tenant).chunk_bytes

    def _expires_in(self, expires_at: float) -> float:
        return max(0.0, expires_at - self._deps.clock())

    # ------------------------------------------------------------------ namespaces and lookups

    @unary
    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:
        """Register the caller's namespace; the handle is scoped to the caller's tenant."""
        tenant = self._tenant(context)
        ns = convert.namespace_from_proto(request.namespace, request.HasField("namespace"))
        prefill = convert.prefill_from_proto(request.prefill, request.HasField("prefill"))
        deadline = convert.deadline_from_proto(request.deadline, request.HasField("deadline"))
        try:
            handle = await self._run(self._manager.register_namespace, ns, tenant)
        except InvalidArgumentError as exc:
            if exc.field != "layout":
                raise
            raise InvalidArgumentError("namespace.layout", str(exc).removeprefix("layout: ")) from None
        chunk_bytes = ns.layout.chunk_bytes
        self._deps.handles.add(handle, tenant, chunk_bytes, ns.layout.chunk_tokens, prefill, deadline)
        logger.info(
            "engine %r of tenant %r registered %s@%s as %s (prefill model %s, deadline model %s)",
            request.engine_id,
            tenant,
            ns.model_id,
            ns.revision,
            handle.hex(),
            prefill,
            deadline,
        )
        dp = self._deps.data_plane
        return pb.RegisterResponse(
            handle=handle,
            layout=convert.layout_to_proto(ns.layout),
            chunk_bytes=chunk_bytes,
            data_plane=pb.DataPlane(
                shm_segment=dp.segment,
                slot_bytes=dp.slot_bytes,
                num_slots=dp.num_slots,
                segment_bytes=dp.slot_bytes * dp.num_slots,
            ),
            lease_ttl_s=self._deps.lease_ttl_s,
            max_stream_message_bytes=self._deps.stream.stream_chunk_bytes,
        )

    @unary
    async def Lookup(self, request: pb.LookupRequest, context: Any) -> pb.LookupResponse:
        """Per-tier contiguous hits; with ``prefetch``, promotion of the cached prefix into L2 starts."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        result = await self._run(self._manager.lookup, handle, keys, True)
        prefetch_id = 0
        if request.prefetch and result.by_tier.get(SHM, 0) < result.chunks:
            prefetch = await self._run(self._manager.prefetch, handle, keys[: result.chunks], SHM)
            prefetch_id = self._prefetches.add(handle, prefetch)
        return convert.lookup_to_proto(result, prefetch_id)

    @unary
    async def Prefetch(self, request: pb.PrefetchRequest, context: Any) -> pb.PrefetchResponse:
        """Promote into L2, waiting at most ``timeout_s`` (the promotions go on after a timeout).

        Promotions still running when the call returns keep going under ``prefetch_id`` (CancelPrefetch
        drops them); a client that cancels the call while it waits cancels the promotions too.
        """
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        timeout = convert.timeout_from_proto(request.timeout_s)
        prefetch = await self._run(self._manager.prefetch, handle, keys, SHM)
        pending = [asyncio.wrap_future(f) for f in prefetch.futures if not f.done()]
        if pending and timeout > 0:
            try:
                # asyncio.wait cancels nothing itself, neither on timeout nor when this call is cancelled.
                await asyncio.wait(pending, timeout=timeout)
            except asyncio.CancelledError:
                dropped = prefetch.cancel()
                logger.debug("Prefetch cancelled by its client: %d promotions dropped", dropped)
                raise
        return pb.PrefetchResponse(ready=prefetch.ready(), prefetch_id=self._prefetches.add(handle, prefetch))

    @unary
    async def CancelPrefetch(
        self, request: pb.CancelPrefetchRequest, context: Any
    ) -> pb.CancelPrefetchResponse:
        """Drop the promotions of a prefetch that have not started (0 for an unknown or finished id)."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        cancelled = self._prefetches.cancel(request.prefetch_id, handle)
        return pb.CancelPrefetchResponse(cancelled=cancelled or 0)

    # ------------------------------------------------------------------ stores through shared memory

    @unary
    async def BeginStore(self, request: pb.BeginStoreRequest, context: Any) -> pb.BeginStoreResponse:
        """Reserve L2 slots for the chunks not cached yet."""
        handle = request.handle
        chunk_bytes = self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        ttl = convert.ttl_from_proto(request.ttl_s)
        ticket = await self._run(self._manager.begin_store, handle, keys, SHM, ttl, request.start_depth)
        if ticket.slots and ticket.level != SHM:
            await self._run(self._manager.abort_store, ticket.ticket_id)
            raise CapacityError(
                f"keys: no room in the shared-memory tier for {len(ticket.slots)} chunks (everything there is "
                "leased, pinned or too young); retry later"
            )
        self._tickets.add(ticket.ticket_id, handle, ticket.expires_at)
        return pb.BeginStoreResponse(
            ticket_id=ticket.ticket_id,
            slots=convert.slot_refs(ticket.slots, chunk_bytes),
            skipped=ticket.skipped,
            expires_in_s=self._expires_in(ticket.expires_at),
        )

    @unary
    async def CommitStore(self, request: pb.CommitStoreRequest, context: Any) -> pb.CommitStoreResponse:
        """Make a ticket's chunks visible: all of them, or only ``indices`` (the ticket stays open for the rest)."""
        handle = request.handle
        chunk_bytes = self._handle(handle, self._tenant(context))
        indices = list(request.indices)
        known = (
            self._tickets.owned(request.ticket_id, handle)
            if indices
            else self._tickets.take(request.ticket_id, handle)
        )
        if not known:
            raise NotFoundError(
                "ticket_id",
                f"{request.ticket_id} is not an open store ticket of this handle (finished or expired?)",
            )
        stored = await self._run(self._manager.commit_store, request.ticket_id, indices or None)
        self._deps.metrics.add_bytes("shm", "store", stored * chunk_bytes)
        return pb.CommitStoreResponse(stored=stored)

    @unary
    async def AbortStore(self, request: pb.AbortStoreRequest, context: Any) -> pb.AbortStoreResponse:
        """Discard a ticket's reservations (False when it is not an open ticket of this handle)."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        aborted = self._tickets.take(request.ticket_id, handle) and await self._run(
            self._manager.abort_store, request.ticket_id
        )
        return pb.AbortStoreResponse(aborted=aborted)

    # ------------------------------------------------------------------ loads through shared memory

    @unary
    async def AcquireLoad(self, request: pb.AcquireLoadRequest, context: Any) -> pb.AcquireLoadResponse:
        """Lease the L2 slots of the cached prefix the load policy chooses (promoting chunks from L3 first).

        See :mod:`.loads` for the policies. A call cancelled by its client while the lease is being taken
        releases the lease as soon as it exists.
        """
        arrived = time.monotonic()
        handle = request.handle
        info = self._deps.handles.check(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        ttl = convert.ttl_from_proto(request.ttl_s)
        kind = convert.load_policy_from_proto(int(request.policy))
        timeout = convert.timeout_from_proto(request.timeout_s)
        policy = resolve_policy(kind, timeout, info)
        wait_s = policy.wait_s(request.prompt_tokens or len(keys) * info.chunk_tokens)
        executor = self._deps.executor if wait_s == 0 else (self._deps.wait_executor or self._deps.executor)
        fut = executor.submit(run_load, self._manager, handle, keys, SHM, ttl, policy, wait_s, arrived)
        try:
            outcome = await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(self._release_orphan)
            raise
        ticket = outcome.ticket
        if ticket.lease_id:
            self._leases.add(ticket.lease_id, handle, ticket.expires_at)
            if FASTEST in self._manager.levels:
                # Loaded chunks are hot: keep a copy in the fastest tier too, so that they outlive an eviction
                # from shared memory (background promotions, single-flight and byte-bounded).
                self._fire(self._manager.prefetch, handle, keys[: len(ticket.chunks)], FASTEST)
        self._deps.metrics.add_bytes("shm", "load", len(ticket.chunks) * info.chunk_bytes)
        plan = outcome.plan
        return pb.AcquireLoadResponse(
            lease_id=ticket.lease_id,
            slots=convert.slot_refs(ticket.chunks, info.chunk_bytes),
            expires_in_s=self._expires_in(ticket.expires_at) if ticket.lease_id else 0.0,
            cached=outcome.cached,
            estimated_load_s=plan.load_s if plan is not None else 0.0,
            estimated_recompute_s=plan.recompute_s if plan is not None else 0.0,
        )

    def _release_orphan(self, fut: Future[LoadOutcome]) -> None:
        """Release the lease of a load whose caller went away (runs on an executor thread)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        lease_id = fut.result().ticket.lease_id
        if lease_id:
            logger.debug("AcquireLoad cancelled by its client: releasing lease %d", lease_id)
            self._fire(self._manager.release, lease_id)

    @unary
    async def ReleaseLoad(self, request: pb.ReleaseLoadRequest, context: Any) -> pb.ReleaseLoadResponse:
        """End a lease (False when it is not a live lease of this handle)."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        released = self._leases.take(request.lease_id, handle) and await self._run(
            self._manager.release, request.lease_id
        )
        return pb.ReleaseLoadResponse(released=released)

    # ------------------------------------------------------------------ single-flight prefill and usage

    @unary
    async def ClaimPrefill(self, request: pb.ClaimPrefillRequest, context: Any) -> pb.ClaimPrefillResponse:
        """Claim the uncached chunks of a chain nobody computes yet; say which to wait for and which to lead."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        ttl = convert.ttl_from_proto(request.ttl_s)
        claim = await self._run(self._manager.claim_prefill, handle, keys, ttl)
        if claim.claim_id:
            self._claims.add(claim.claim_id, handle)
        return convert.claim_to_proto(claim)

    @unary
    async def WaitPrefill(self, request: pb.WaitPrefillRequest, context: Any) -> pb.WaitPrefillResponse:
        """Wait until the next chunk the chain needs is published or no longer computed, or ``timeout_s``.

        The wait holds a thread of the wait executor; it is capped at :data:`MAX_PREFILL_WAIT_S`.
        """
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        timeout = min(convert.timeout_from_proto(request.timeout_s), MAX_PREFILL_WAIT_S)
        if request.claim_id and not self._claims.owned(request.claim_id, handle):
            raise NotFoundError("claim_id", f"{request.claim_id} is not a prefill claim of this handle")
        cached = await self._run_long(self._manager.wait_prefill, handle, keys, timeout, request.claim_id)
        return pb.WaitPrefillResponse(cached=cached)

    @unary
    async def ReleasePrefill(
        self, request: pb.ReleasePrefillRequest, context: Any
    ) -> pb.ReleasePrefillResponse:
        """Give a claim up at once: its unpublished chunks may be taken over (0 for an unknown claim)."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        if not self._claims.owned(request.claim_id, handle):
            return pb.ReleasePrefillResponse(released=0)
        self._claims.discard(request.claim_id)
        released = await self._run(self._manager.release_prefill, request.claim_id)
        return pb.ReleasePrefillResponse(released=released)

    @unary
    async def ReportUsage(self, request: pb.ReportUsageRequest, context: Any) -> pb.ReportUsageResponse:
        """Count what an engine did with a load: tokens it skipped per source tier, and recomputed."""
        handle = request.handle
        info = self._deps.handles.check(handle, self._tenant(context))
        effective = convert.usage_from_proto(request.effective_chunks, info.chunk_tokens)
        await self._run(self._manager.report_usage, handle, effective, int(request.recomputed_tokens))
        return pb.ReportUsageResponse()

    # ------------------------------------------------------------------ pinning, purge, stats, events

    @unary
    async def Pin(self, request: pb.PinRequest, context: Any) -> pb.PinResponse:
        """Pin chunks, or the whole namespace when no keys are given."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys) or None
        return pb.PinResponse(chunks=await self._run(self._manager.pin, handle, keys))

    @unary
    async def Unpin(self, request: pb.PinRequest, context: Any) -> pb.PinResponse:
        """Unpin chunks, or the whole namespace when no keys are given."""
        handle = request.handle
        self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys) or None
        return pb.PinResponse(chunks=await self._run(self._manager.unpin, handle, keys))

    @unary
    async def Purge(self, request: pb.PurgeRequest, context: Any) -> pb.PurgeResponse:
        """Remove every chunk of the namespace from every tier; logs an audit line, emits CLEARED."""
        handle = request.handle
        tenant = self._tenant(context)
        self._handle(handle, tenant)
        removed = await self._run(self._manager.purge, handle)
        logger.warning("AUDIT purge tenant=%s handle=%s removed=%d", tenant, handle.hex(), removed)
        self._deps.events.publish(HubEventKind.CLEARED, None, handle)
        return pb.PurgeResponse(removed=removed)

    @unary
    async def Stats(self, request: pb.StatsRequest, context: Any) -> pb.StatsResponse:
        """A snapshot of the cache's counters."""
        self._tenant(context)
        return stats_to_proto(await self._run(self._manager.stats))

    @server_stream
    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Any) -> AsyncIterator[pb.CacheEvent]:
        """Retained events after ``after_sequence``, then live ones, of the caller's namespaces.

        Initial metadata is sent as soon as the subscription is in place: a client that waits for it knows
        that every later change reaches it.
        """
        tenant = self._tenant(context)
        handles = self._deps.handles

        def mine(event: HubEvent) -> bool:
            return not self._deps.auth.enabled or handles.owner(event.handle) == tenant

        subscription = self._deps.events.subscribe(request.after_sequence, mine)
        try:
            await context.send_initial_metadata(())  # tells the client the subscription is live
            async for event in subscription:
                yield convert.event_to_proto(event)
        finally:
            subscription.close()

    # ------------------------------------------------------------------ byte streams

    @unary
    async def StreamStore(
        self, request_iterator: AsyncIterator[pb.StreamStoreMessage], context: Any
    ) -> pb.StreamStoreResponse:
        """Store chunks sent as pieces; all are committed when the client closes the stream."""
        tenant = self._tenant(context)
        handle = b""
        start_depth = 0
        assembler: ChunkAssembler | None = None
        tickets: list[StoreTicket] = []
        skipped: list[int] = []
        chunk_bytes = 0
        try:
            async for msg in request_iterator:
                if assembler is None:
                    handle = msg.handle
                    chunk_bytes = self._handle(handle, tenant)
                    assembler = ChunkAssembler(chunk_bytes)
                    start_depth = msg.start_depth
                elif msg.handle and msg.handle != handle:
                    raise InvalidArgumentError("handle", "differs from the stream's first message")
                piece = assembler.check(msg)
                if piece.starts_chunk:
                    ticket = await self._run(
                        self._manager.begin_store, handle, [piece.key], SHM, None, start_depth + piece.index
                    )
                    tickets.append(ticket)
                    if not ticket.slots:
                        skipped.append(piece.index)
                    assembler.open(piece, ticket.slots[0].buffer if ticket.slots else None)
                if len(piece.data) > INLINE_BYTES:
                    await self._run(assembler.write, piece)
                else:
                    assembler.write(piece)
            if assembler is None:
                return pb.StreamStoreResponse()
            assembler.finish()
            stored = 0
            while tickets:
                stored += await self._run(self._manager.commit_store, tickets[0].ticket_id)
                tickets.pop(0)
        finally:
            for ticket in tickets:
                self._fire(self._manager.abort_store, ticket.ticket_id)
        self._deps.metrics.add_bytes("stream", "store", stored * chunk_bytes)
        return pb.StreamStoreResponse(stored=stored, skipped=skipped)

    @server_stream
    async def StreamLoad(
        self, request: pb.StreamLoadRequest, context: Any
    ) -> AsyncIterator[pb.StreamLoadMessage]:
        """Stream the cached prefix as pieces of at most the negotiated message size."""
        handle = request.handle
        chunk_bytes = self._handle(handle, self._tenant(context))
        keys = convert.keys_from_proto(request.keys)
        zstd = convert.codec_from_proto(int(request.codec))
        piece_bytes = self._deps.stream.stream_chunk_bytes
        if request.max_message_bytes:
            piece_bytes = min(piece_bytes, request.max_message_bytes)
        cctx = zstandard.ZstdCompressor(level=LOAD_ZSTD_LEVEL) if zstd else None
        ticket = await self._run(self._manager.acquire, handle, keys, SHM, None)
        done = ticket.lease_id == 0
        try:
            for chunk in ticket.chunks:
                for start in range(0, chunk_bytes, piece_bytes):
                    stop = min(start + piece_bytes, chunk_bytes)
                    if stop - start > INLINE_BYTES:
                        data, packed = await self._run(encode_piece, chunk.view, start, stop, cctx)
                    else:
                        data, packed = encode_piece(chunk.view, start, stop, cctx)
                    yield pb.StreamLoadMessage(
                        index=chunk.index,
                        key=chunk.key,
                        offset=start,
                        data=data,
                        codec=pb.CODEC_ZSTD if packed else pb.CODEC_RAW,
                        last=stop == chunk_bytes,
                        chunk_bytes=chunk_bytes,
                    )
                self._deps.metrics.add_bytes("stream", "load", chunk_bytes)
            await self._run(self._manager.release, ticket.lease_id)
            done = True
        finally:
            if not done:  # cancelled or failed: release without waiting (this coroutine may not resume)
                self._fire(self._manager.release, ticket.lease_id)


class DiagnosticsServicer(pb_grpc.DiagnosticsServicer, _Translating):
    """``tiercache.v1.Diagnostics``: bare echo baselines over the same server and socket."""

    async def Echo(self, request: pb.EchoMessage, context: Any) -> pb.EchoMessage:
        """Return the request's bytes."""
        try:
            self._tenant(context)
        except TierCacheError as exc:
            await abort_with(context, exc)
        return pb.EchoMessage(data=request.data)

    async def EchoStream(
        self, request_iterator: AsyncIterator[pb.EchoMessage], context: Any
    ) -> AsyncIterator[pb.EchoMessage]:
        """Return every message's bytes."""
        try:
            self._tenant(context)
        except TierCacheError as exc:
            await abort_with(context, exc)
        async for message in request_iterator:
            yield pb.EchoMessage(data=message.data)

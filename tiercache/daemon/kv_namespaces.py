"""KVCacheService handlers of namespaces and what is cached in them: Register, Lookup, Prefetch,
CancelPrefetch, Pin, Unpin, Purge, ReportUsage, Stats, WatchEvents.

Each handler converts the request (:mod:`.convert`), makes the core call (through
:class:`~tiercache.cache.rules.EngineRules` where the engine-facing rules apply) and converts the result;
authentication and the handle check happen in the decorators of :mod:`.rpc`. Running prefetches are kept by
id in :mod:`.prefetches` so that CancelPrefetch can drop them.

A Lookup is answered on the event loop when the index can answer at once (no other thread holds its lock,
no shared tier has to be asked, at most ``INLINE_LOOKUP_KEYS`` keys): an executor hop costs about as much
as the lookup of a few hundred keys. Otherwise it runs in the executor like every other cache call.

Primitives:
    NamespaceRpcs: the handlers (a part of :class:`~tiercache.daemon.servicer.KVCacheServicer`).
    INLINE_LOOKUP_KEYS: the longest chain a Lookup looks up on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from tiercache.cache.rules import LookupOutcome
from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire import layout_to_proto, stats_to_proto

from . import convert
from .events import HubEvent, HubEventKind
from .prefetches import PrefetchTable
from .rpc import Caller, ServiceDeps, ServicerBase, server_stream_tenant, unary, unary_tenant

logger = logging.getLogger(__name__)

INLINE_LOOKUP_KEYS = 4096
"""The longest chain looked up on the event loop (~1 µs of the loop per key); longer ones go to the
executor."""


class NamespaceRpcs(ServicerBase):
    """Registration, lookups and prefetches, pins, purge, usage reports, stats and events."""

    def __init__(self, deps: ServiceDeps) -> None:
        """Args: deps: what the servicer works with."""
        super().__init__(deps)
        self._prefetches = PrefetchTable(deps.holdings.shares.prefetches)

    @unary_tenant
    async def Register(self, request: pb.RegisterRequest, tenant: str, context: Any) -> pb.RegisterResponse:
        """Register the caller's namespace; the handle is scoped to the caller's tenant.

        With tokens and the isolated data plane, the namespace's L2 chunks go to the tenant's own pool and
        the answer names it with a one-time grant for its file descriptor (:mod:`.fdserver`).
        """
        args = convert.register_from_proto(request)
        ns, prefill, deadline = args.namespace, args.prefill, args.deadline
        self._deps.handles.admit(ns.scoped_id(tenant), tenant)  # the tenant's cap of namespaces
        try:
            handle = await self.run(self._manager.register_namespace, ns, tenant)
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
        if dp.pools is not None and self._deps.auth.enabled:
            data_plane = dp.pools.register(handle, tenant)  # the tenant's own pool, by file descriptor
        else:
            data_plane = pb.DataPlane(
                shm_segment=dp.segment,
                slot_bytes=dp.slot_bytes,
                num_slots=dp.num_slots,
                segment_bytes=dp.segment_bytes or dp.slot_bytes * dp.num_slots,
                max_chunk_bytes=dp.max_chunk_bytes,
                index_entries=dp.index_entries,
            )
        return pb.RegisterResponse(
            handle=handle,
            layout=layout_to_proto(ns.layout),
            chunk_bytes=chunk_bytes,
            data_plane=data_plane,
            lease_ttl_s=self._deps.lease_ttl_s,
            max_ttl_s=self._deps.max_ttl_s,
            max_stream_message_bytes=self._deps.stream.stream_chunk_bytes,
            control_socket=self._deps.control_socket,
            packed_keys=True,
        )

    @unary
    async def Lookup(self, request: pb.LookupRequest, caller: Caller, context: Any) -> pb.LookupResponse:
        """Per-tier contiguous hits; with ``prefetch``, promotion of the cached prefix into L2 starts."""
        keys = convert.lookup_keys(request)
        handle = caller.namespace_id
        result = self._rules.lookup_now(handle, keys) if len(keys) <= INLINE_LOOKUP_KEYS else None
        if result is None:
            found = await self.run(self._rules.lookup, handle, keys, request.prefetch)
        else:  # answered on the event loop, without an executor hop; a prefetch still starts in the executor
            started = None
            if request.prefetch and self._rules.wants_prefetch(result):
                started = await self.run(self._rules.prefetch, handle, keys[: result.chunks])
            found = LookupOutcome(result, started)
        prefetch_id = 0
        if found.prefetch is not None:
            prefetch_id = self._prefetches.add(caller.namespace_id, found.prefetch, caller.tenant)
        return convert.lookup_to_proto(found.result, prefetch_id)

    @unary
    async def Prefetch(
        self, request: pb.PrefetchRequest, caller: Caller, context: Any
    ) -> pb.PrefetchResponse:
        """Promote into L2, waiting at most ``timeout_s`` (the promotions go on after a timeout).

        Promotions still running when the call returns keep going under ``prefetch_id`` (CancelPrefetch
        drops them); a client that cancels the call while it waits cancels the promotions too.
        """
        keys = convert.keys_from_proto(request.keys)
        timeout = convert.timeout_from_proto(request.timeout_s)
        prefetch = await self.run(self._rules.prefetch, caller.namespace_id, keys)
        pending = [asyncio.wrap_future(f) for f in prefetch.futures if not f.done()]
        if pending and timeout > 0:
            try:
                # asyncio.wait cancels nothing itself, neither on timeout nor when this call is cancelled.
                await asyncio.wait(pending, timeout=timeout)
            except asyncio.CancelledError:
                dropped = prefetch.cancel()
                logger.debug("Prefetch cancelled by its client: %d promotions dropped", dropped)
                raise
        return pb.PrefetchResponse(
            ready=prefetch.ready(),
            prefetch_id=self._prefetches.add(caller.namespace_id, prefetch, caller.tenant),
        )

    @unary
    async def CancelPrefetch(
        self, request: pb.CancelPrefetchRequest, caller: Caller, context: Any
    ) -> pb.CancelPrefetchResponse:
        """Drop the promotions of a prefetch that have not started (0 for an unknown or finished id)."""
        cancelled = self._prefetches.cancel(request.prefetch_id, caller.namespace_id)
        return pb.CancelPrefetchResponse(cancelled=cancelled or 0)

    @unary
    async def ReportUsage(
        self, request: pb.ReportUsageRequest, caller: Caller, context: Any
    ) -> pb.ReportUsageResponse:
        """Count what an engine did with a load: tokens it copied and skipped per source tier, and
        recomputed."""
        usage = convert.usage_report_from_proto(request, caller.info.chunk_tokens)
        await self.run(
            self._manager.report_usage,
            caller.namespace_id,
            usage.effective,
            usage.recomputed_tokens,
            usage.loaded,
            usage.read_keys,
        )
        return pb.ReportUsageResponse()

    @unary
    async def Pin(self, request: pb.PinRequest, caller: Caller, context: Any) -> pb.PinResponse:
        """Pin chunks, or the whole namespace when no keys are given."""
        keys = convert.keys_from_proto(request.keys) or None
        return pb.PinResponse(chunks=await self.run(self._manager.pin, caller.namespace_id, keys))

    @unary
    async def Unpin(self, request: pb.PinRequest, caller: Caller, context: Any) -> pb.PinResponse:
        """Unpin chunks, or the whole namespace when no keys are given."""
        keys = convert.keys_from_proto(request.keys) or None
        return pb.PinResponse(chunks=await self.run(self._manager.unpin, caller.namespace_id, keys))

    @unary
    async def Purge(self, request: pb.PurgeRequest, caller: Caller, context: Any) -> pb.PurgeResponse:
        """Remove every chunk of the namespace from every tier; logs an audit line, emits CLEARED."""
        handle = caller.namespace_id
        removed = await self.run(self._manager.purge, handle)
        logger.warning("AUDIT purge tenant=%s handle=%s removed=%d", caller.tenant, handle.hex(), removed)
        self._deps.events.publish(HubEventKind.CLEARED, None, handle)
        return pb.PurgeResponse(removed=removed)

    @unary_tenant
    async def Stats(self, request: pb.StatsRequest, tenant: str, context: Any) -> pb.StatsResponse:
        """A snapshot of the cache's counters: with tenants (a tokens file), the caller's own only (the whole
        cache for the operator's token)."""
        own = None if self._deps.auth.cache_wide(tenant) else tenant
        return stats_to_proto(await self.run(self._manager.stats, own))

    @server_stream_tenant
    async def WatchEvents(
        self, request: pb.WatchEventsRequest, tenant: str, context: Any
    ) -> AsyncIterator[pb.CacheEvent]:
        """Retained events after ``after_sequence``, then live ones, of the caller's namespaces.

        Every event carries the daemon's epoch; a resume point of another epoch, beyond the latest event or
        older than the replay window gets a KIND_RESYNC event first (see :mod:`.events`).

        Initial metadata is sent as soon as the subscription is in place: a client that waits for it knows
        that every later change reaches it.
        """
        handles, auth = self._deps.handles, self._deps.auth.enabled

        def mine(event: HubEvent) -> bool:
            return not auth or handles.owner(event.handle) == tenant

        with self._deps.holdings.hold(tenant, "subscriptions"):
            scope = tenant if auth else ""  # the tenant's own stream: its own sequence numbers
            subscription = self._deps.events.subscribe(request.after_sequence, mine, request.epoch, scope)
            try:
                await context.send_initial_metadata(())  # tells the client the subscription is live
                async for event in subscription:
                    yield convert.event_to_proto(event)
            finally:
                subscription.close()

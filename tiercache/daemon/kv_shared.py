"""KVCacheService handlers of stores and loads through shared memory: BeginStore, CommitStore, AbortStore,
AcquireLoad, ReleaseLoad.

Engines store into and load from L2, the shared-memory tier named in ``RegisterResponse.data_plane``
(:class:`~tiercache.cache.rules.EngineRules` holds that rule and the warming of L1 after a load). Each store
ticket and load lease is remembered under the handle it was taken with (:class:`~.handles.Claims`), so that
one engine cannot commit or release another namespace's work. A commit after the ticket's TTL is refused
with FAILED_PRECONDITION naming the ticket (:class:`~tiercache.errors.ExpiredError`). A small commit that
nothing can make wait runs on the event loop (:mod:`.commits`), others in the executor.

AcquireLoad and BeginStore first settle what the request carries (:mod:`.settle`: leases the engine is done
with, its usage report), in the same executor job as their own work. AcquireLoad's policies are resolved in
:mod:`.loads`. A load whose whole cached prefix is in L2 already, and a release, are answered on the event
loop when the index lock is free (an executor hop costs more than leasing a few dozen chunks); otherwise a
load that may wait for promotion out of a slow L3 runs in the bounded wait executor, one that waits for
nothing (``wait_s == 0``) in the short one.

Primitives:
    MAX_MORE_CHAINS: the most further chains one AcquireLoad carries.
    SharedMemoryRpcs: the handlers (a part of :class:`~tiercache.daemon.servicer.KVCacheServicer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from tiercache.cache import StoreTicket
from tiercache.cache.rules import DEVICE_LEVEL
from tiercache.errors import ExpiredError, InvalidArgumentError, NotFoundError
from tiercache.policies.load import LoadPolicy
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire import LOAD_POLICIES

from . import convert
from .commits import commit_now
from .handles import Claims
from .loads import LoadOutcome, resolve_policy, run_load, run_load_now
from .rpc import Caller, ServiceDeps, ServicerBase, unary
from .settle import Settled, apply, taken

logger = logging.getLogger(__name__)

MAX_MORE_CHAINS = 256
"""Most further chains one AcquireLoad may carry (a scheduler step's requests)."""


class SharedMemoryRpcs(ServicerBase):
    """Two-phase stores into, and leased loads out of, the shared-memory tier."""

    def __init__(self, deps: ServiceDeps) -> None:
        """Args: deps: what the servicer works with."""
        super().__init__(deps)
        self._tickets = Claims(deps.clock)
        self._leases = Claims(deps.clock)

    @unary
    async def BeginStore(
        self, request: pb.BeginStoreRequest, caller: Caller, context: Any
    ) -> pb.BeginStoreResponse:
        """Reserve L2 slots for the chunks not cached yet (after settling what the request carries)."""
        keys = convert.keys_from_proto(request.keys)
        ttl = convert.ttl_from_proto(request.ttl_s)
        settled = self._settled(request.settle, caller) if request.HasField("settle") else None
        ticket = await self.run(
            self._begin_store, settled, caller.namespace_id, keys, ttl, request.start_depth
        )
        self._tickets.add(ticket.ticket_id, caller.namespace_id, ticket.expires_at)
        resp = pb.BeginStoreResponse(
            ticket_id=ticket.ticket_id,
            skipped=ticket.skipped,
            expires_in_s=self.expires_in(ticket.expires_at),
        )
        convert.add_store_refs(resp.slots, ticket.slots, caller.info.chunk_bytes)
        return resp

    def _begin_store(
        self, settled: Settled | None, handle: bytes, keys: list[bytes], ttl: float | None, start_depth: int
    ) -> StoreTicket:
        if settled is not None and not settled.empty:
            apply(self._manager, settled)
        return self._rules.begin_shared_store(handle, keys, ttl, start_depth)

    def _settled(self, settle: pb.Settlement, caller: Caller) -> Settled:
        """The request's settlement, its leases taken out of this handle's claims."""
        return taken(self._leases, settle, caller.namespace_id, caller.info.chunk_tokens)

    @unary
    async def CommitStore(
        self, request: pb.CommitStoreRequest, caller: Caller, context: Any
    ) -> pb.CommitStoreResponse:
        """Make a ticket's chunks visible: all of them, or only ``indices`` (the ticket stays open for the rest)."""
        handle = caller.namespace_id
        indices = list(request.indices)
        known = (
            self._tickets.owned(request.ticket_id, handle)
            if indices
            else self._tickets.take(request.ticket_id, handle)
        )
        lapsed = None if known else self._tickets.lapsed(request.ticket_id, handle)
        if lapsed is not None:
            raise ExpiredError(
                "ticket_id",
                f"store ticket {request.ticket_id} expired {self._deps.clock() - lapsed:.3f} s ago, before"
                " this commit; its slots were taken back (store the chunks again, with a longer ttl_s)",
            )
        if not known:
            raise NotFoundError(
                "ticket_id",
                f"{request.ticket_id} is not an open store ticket of this handle (finished or expired?)",
            )
        sums = dict(request.checksums) or None  # taken by the engine as it copied: L2 does not hash again
        stored = commit_now(
            self._manager,
            request.ticket_id,
            indices or None,
            caller.info.chunk_bytes,
            self._deps.quotas_active,
            sums,
        )
        if stored is None:  # it may wait, or is large: in the executor
            stored = await self.run(self._manager.commit_store, request.ticket_id, indices or None, sums)
        self._deps.metrics.add_bytes("shm", "store", stored * caller.info.chunk_bytes)
        return pb.CommitStoreResponse(stored=stored)

    @unary
    async def AbortStore(
        self, request: pb.AbortStoreRequest, caller: Caller, context: Any
    ) -> pb.AbortStoreResponse:
        """Discard a ticket's reservations (False when it is not an open ticket of this handle)."""
        aborted = self._tickets.take(request.ticket_id, caller.namespace_id) and await self.run(
            self._manager.abort_store, request.ticket_id
        )
        return pb.AbortStoreResponse(aborted=aborted)

    @unary
    async def AcquireLoad(
        self, request: pb.AcquireLoadRequest, caller: Caller, context: Any
    ) -> pb.AcquireLoadResponse:
        """Lease the L2 slots of the cached prefix the load policy chooses (promoting chunks from L3 first);
        each of ``more_chains`` likewise, under its own lease, answered in ``more`` (one call for a
        scheduler step's requests).

        See :mod:`.loads` for the policies. A call cancelled by its client while the lease is being taken
        releases the lease as soon as it exists.
        """
        arrived = time.monotonic()
        if len(request.more_chains) > MAX_MORE_CHAINS:
            raise InvalidArgumentError(
                "more_chains", f"at most {MAX_MORE_CHAINS} chains in one call, got {len(request.more_chains)}"
            )
        ttl = convert.ttl_from_proto(request.ttl_s)
        kind = LOAD_POLICIES.from_proto(int(request.policy), "policy")
        timeout = convert.timeout_from_proto(request.timeout_s)
        policy = resolve_policy(kind, timeout, caller.info)
        settled = self._settled(request.settle, caller) if request.HasField("settle") else None
        keys = convert.keys_from_proto(request.keys)
        response = await self._load_one(keys, request.prompt_tokens, ttl, policy, arrived, settled, caller)
        for chain in request.more_chains:
            more = convert.keys_from_proto(chain.keys)
            response.more.append(await self._load_one(more, 0, ttl, policy, arrived, None, caller))
        return response

    async def _load_one(
        self,
        keys: Sequence[bytes],
        prompt_tokens: int,
        ttl: float | None,
        policy: LoadPolicy,
        arrived: float,
        settled: Settled | None,
        caller: Caller,
    ) -> pb.AcquireLoadResponse:
        """One chain's lookup, promotion and lease (see :meth:`AcquireLoad`)."""
        handle, info = caller.namespace_id, caller.info
        wait_s = policy.wait_s(prompt_tokens or len(keys) * info.chunk_tokens)
        executor = self._deps.executor if wait_s == 0 else self.long_executor(caller.tenant)
        level = self._rules.shared_level
        outcome = run_load_now(self._manager, handle, keys, level, ttl, policy, settled)
        if outcome is None:  # it may wait (a promotion, the lock): in an executor
            fut = executor.submit(
                run_load, self._manager, handle, keys, level, ttl, policy, wait_s, arrived, settled
            )
            try:
                outcome = await asyncio.wrap_future(fut)
            except asyncio.CancelledError:
                fut.add_done_callback(self._release_orphan)
                raise
        ticket = outcome.ticket
        if ticket.lease_id:
            self._leases.add(ticket.lease_id, handle, ticket.expires_at)
            if DEVICE_LEVEL in self._manager.levels:  # else the warm-up has nothing to do: no executor hop
                self.fire(self._rules.warm_after_load, handle, keys, ticket)
        self._deps.metrics.add_bytes("shm", "load", len(ticket.chunks) * info.chunk_bytes)
        plan = outcome.plan
        response = pb.AcquireLoadResponse(
            lease_id=ticket.lease_id,
            expires_in_s=self.expires_in(ticket.expires_at) if ticket.lease_id else 0.0,
            cached=outcome.cached,
            estimated_load_s=plan.load_s if plan is not None else 0.0,
            estimated_recompute_s=plan.recompute_s if plan is not None else 0.0,
        )
        convert.add_load_refs(response.slots, ticket.chunks, info.chunk_bytes)
        return response

    def _release_orphan(self, fut: Future[LoadOutcome]) -> None:
        """Release the lease of a load whose caller went away (runs on an executor thread)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        lease_id = fut.result().ticket.lease_id
        if lease_id:
            logger.debug("AcquireLoad cancelled by its client: releasing lease %d", lease_id)
            self.fire(self._manager.release, lease_id)

    @unary
    async def ReleaseLoad(
        self, request: pb.ReleaseLoadRequest, caller: Caller, context: Any
    ) -> pb.ReleaseLoadResponse:
        """End a lease (False when it is not a live lease of this handle)."""
        released: bool | None = False
        if self._leases.take(request.lease_id, caller.namespace_id):
            with self._manager.uncontended() as free:  # at once when the lock is free: no executor hop
                released = self._manager.release(request.lease_id) if free else None
            if released is None:
                released = await self.run(self._manager.release, request.lease_id)
        return pb.ReleaseLoadResponse(released=released)

"""KVCacheService handlers of single-flight prefill: ClaimPrefill, WaitPrefill, ReleasePrefill.

Concurrent requests that miss the same prefix coordinate: the first claims the chunks nobody computes yet
and leads, the others wait (bounded) while the leader publishes. Each claim is remembered under the handle
that took it (:class:`~.handles.Owners`), so that one engine cannot wait on or give up another namespace's
claim. A wait holds a thread of the wait executor, so it is capped at :data:`MAX_PREFILL_WAIT_S`.

Primitives:
    PrefillRpcs: the handlers (a part of :class:`~tiercache.daemon.servicer.KVCacheServicer`).
    MAX_PREFILL_WAIT_S: the cap of one WaitPrefill.
"""

from __future__ import annotations

from typing import Any

from tiercache.errors import NotFoundError
from tiercache.proto import tiercache_pb2 as pb

from . import convert
from .handles import Owners
from .rpc import Caller, ServiceDeps, ServicerBase, unary

MAX_PREFILL_WAIT_S = 60.0
"""A WaitPrefill waits at most this long, whatever its timeout_s: a wait holds a thread, and a draining
daemon lets the waits in flight end before it exits."""


class PrefillRpcs(ServicerBase):
    """Prefill claims, waits for their publication, and their release."""

    def __init__(self, deps: ServiceDeps) -> None:
        """Args: deps: what the servicer works with."""
        super().__init__(deps)
        self._claims = Owners(deps.holdings.shares.prefill_claims)

    @unary
    async def ClaimPrefill(
        self, request: pb.ClaimPrefillRequest, caller: Caller, context: Any
    ) -> pb.ClaimPrefillResponse:
        """Claim the uncached chunks of a chain nobody computes yet; say which to wait for and which to lead."""
        keys = convert.keys_from_proto(request.keys)
        ttl = convert.ttl_from_proto(request.ttl_s)
        claim = await self.run(self._manager.claim_prefill, caller.namespace_id, keys, ttl)
        if claim.claim_id:
            self._claims.add(claim.claim_id, caller.namespace_id, caller.tenant)
        return convert.claim_to_proto(claim)

    @unary
    async def WaitPrefill(
        self, request: pb.WaitPrefillRequest, caller: Caller, context: Any
    ) -> pb.WaitPrefillResponse:
        """Wait until the next chunk the chain needs is published or no longer computed, or ``timeout_s``.

        The wait holds a thread of the wait executor; it is capped at :data:`MAX_PREFILL_WAIT_S`.
        """
        handle = caller.namespace_id
        keys = convert.keys_from_proto(request.keys)
        timeout = min(convert.timeout_from_proto(request.timeout_s), MAX_PREFILL_WAIT_S)
        if request.claim_id and not self._claims.owned(request.claim_id, handle):
            raise NotFoundError("claim_id", f"{request.claim_id} is not a prefill claim of this handle")
        cached = await self.run_long(
            caller.tenant, self._manager.wait_prefill, handle, keys, timeout, request.claim_id
        )
        return pb.WaitPrefillResponse(cached=cached)

    @unary
    async def ReleasePrefill(
        self, request: pb.ReleasePrefillRequest, caller: Caller, context: Any
    ) -> pb.ReleasePrefillResponse:
        """Give a claim up at once: its unpublished chunks may be taken over (0 for an unknown claim)."""
        if not self._claims.owned(request.claim_id, caller.namespace_id):
            return pb.ReleasePrefillResponse(released=0)
        self._claims.discard(request.claim_id)
        released = await self.run(self._manager.release_prefill, request.claim_id)
        return pb.ReleasePrefillResponse(released=released)

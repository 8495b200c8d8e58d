"""Settlements: the lease releases and usage reports an engine sends with its next call.

A connector does not spend a round trip of its own on ending a lease whose copy finished in time, nor on
telling the daemon what a load was worth: both ride on its next AcquireLoad or BeginStore of the same
handle (``Settlement``, see the .proto). The handler takes the lease ids this handle owns out of its claims
on the event loop (:func:`taken`), then the executor job that does the call's own work settles first
(:func:`apply`): the leases end (as ReleaseLoad), so that they count neither for the tenant's lease quota
nor against eviction when this call reserves, and the usage is recorded (as ReportUsage).

Primitives:
    Settled: a checked settlement of one handle (lease ids it owned, usage in tokens per tier).
    taken: check a request's settlement and take its leases out of the handle's claims (event loop).
    apply: end the leases and record the usage (blocking: run it in the executor, before the call's work).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiercache.cache import CacheManager
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel

from . import convert
from .handles import Claims


@dataclass(frozen=True, slots=True)
class Settled:
    """What one call settles before its own work.

    Attributes:
        handle: the caller's namespace id.
        lease_ids: live leases of the handle to end (ids it did not own are left out).
        effective: tokens whose prefill the engine skipped, per source tier.
        recomputed_tokens: looked-up tokens the engine computed anyway.
    """

    handle: bytes
    lease_ids: tuple[int, ...]
    effective: Mapping[TierLevel, int]
    recomputed_tokens: int

    @property
    def empty(self) -> bool:
        """Nothing to do."""
        return not self.lease_ids and not self.recomputed_tokens and not any(self.effective.values())


def taken(claims: Claims, settle: pb.Settlement, handle: bytes, chunk_tokens: int) -> Settled:
    """Check ``settle`` and take the leases it names that ``handle`` owns out of ``claims`` (event loop).

    Raises:
        InvalidArgumentError: an unknown tier (``settle.effective_chunks[i].tier``).
    """
    effective = convert.usage_from_proto(settle.effective_chunks, chunk_tokens, "settle.effective_chunks")
    ids = tuple(int(i) for i in settle.release_lease_ids if claims.take(int(i), handle))
    return Settled(handle, ids, effective, int(settle.recomputed_tokens))


def apply(manager: CacheManager, settled: Settled) -> None:
    """End the settled leases and record the usage (blocking: run it in the executor)."""
    for lease_id in settled.lease_ids:
        manager.release(lease_id)
    if settled.recomputed_tokens or any(settled.effective.values()):
        manager.report_usage(settled.handle, settled.effective, settled.recomputed_tokens)

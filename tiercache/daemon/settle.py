"""Settlements: the lease releases and usage reports an engine sends with its next call.

A connector does not spend a round trip of its own on ending a lease whose copy finished in time, nor on
telling the daemon what a load was worth: both ride on its next AcquireLoad or BeginStore of the same
handle (``Settlement``, see the .proto). The handler takes the lease ids this handle owns out of its claims
on the event loop (:func:`taken`), then the executor job that does the call's own work settles first
(:func:`apply`): the leases end (as ReleaseLoad), so that they count neither for the tenant's lease quota
nor against eviction when this call reserves, and the usage is recorded (as ReportUsage).

Loaded tokens are counted only from the usage an engine reports (what it copied out intact and in time): a
lease that ends here counts nothing by itself, so a lease released unused moves no hit counter.

Primitives:
    Settled: a checked settlement of one handle (lease ids it owned, usage in tokens per tier).
    taken: check a request's settlement and take its leases out of the handle's claims (event loop).
    apply: end the leases and record the usage (blocking: run it in the executor, before the call's work).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.cache import CacheManager
from tiercache.proto import tiercache_pb2 as pb

from . import convert
from .handles import Claims


@dataclass(frozen=True, slots=True)
class Settled:
    """What one call settles before its own work.

    Attributes:
        handle: the caller's namespace id.
        lease_ids: live leases of the handle to end (ids it did not own are left out).
        usage: the engine's usage report (loaded, effective and recomputed tokens).
    """

    handle: bytes
    lease_ids: tuple[int, ...]
    usage: convert.Usage

    @property
    def empty(self) -> bool:
        """Nothing to do."""
        return not self.lease_ids and self.usage.empty


def taken(claims: Claims, settle: pb.Settlement, handle: bytes, chunk_tokens: int) -> Settled:
    """Check ``settle`` and take the leases it names that ``handle`` owns out of ``claims`` (event loop).

    Raises:
        InvalidArgumentError: an unknown tier (``settle.effective_chunks[i].tier``, ``settle.loaded_tokens[i].tier``,
            ...).
    """
    usage = convert.usage_report_from_proto(settle, chunk_tokens, "settle.")
    ids = tuple(int(i) for i in settle.release_lease_ids if claims.take(int(i), handle))
    return Settled(handle, ids, usage)


def apply(manager: CacheManager, settled: Settled) -> None:
    """End the settled leases and record the usage (blocking: run it in the executor)."""
    for lease_id in settled.lease_ids:
        manager.release(lease_id)
    usage = settled.usage
    if not usage.empty:
        manager.report_usage(
            settled.handle, usage.effective, usage.recomputed_tokens, usage.loaded, usage.read_keys
        )

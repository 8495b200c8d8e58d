"""What an engine may ask of the cache: the placement rules of the engine-facing API.

Engines reach the daemon's chunks through the shared-memory tier (L2), which they map; the device tier (L1),
when the cache has one, holds a second copy of what engines load, so that hot chunks outlive an eviction from
shared memory. These rules sit here, over :class:`~tiercache.cache.CacheManager`'s public API, so that the
daemon's handlers only translate requests and responses:

* a store through shared memory lands in L2 or is refused (a slot below L2 is one the engine cannot map);
* a store sent as a byte stream lands in L2, or in a slower tier when L2 has no room (the daemon copies it);
* a lookup may start promoting the cached prefix into L2 (a prefetch for the load that follows);
* loads lease L2 slots; after a load the device tier is warmed with the loaded prefix, in the background.

All methods but ``lookup_now`` and ``wants_prefetch`` block (they take the manager's lock, some do I/O): run
them in an executor.

Primitives:
    SHARED_LEVEL: the tier engines map. DEVICE_LEVEL: the tier warmed after loads.
    LookupOutcome: a lookup and the prefetch it started.
    EngineRules: ``begin_shared_store``, ``begin_stream_store``, ``lookup``, ``lookup_now``,
        ``wants_prefetch``, ``prefetch``, ``lease``, ``warm_after_load``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.cache import CacheManager, LoadTicket, LookupResult, Prefetch, StoreTicket
from tiercache.errors import CapacityError
from tiercache.tiers.base import TierLevel

logger = logging.getLogger(__name__)

SHARED_LEVEL = TierLevel.L2
"""The tier engines reach through shared memory: stores and loads of engines use its slots."""
DEVICE_LEVEL = TierLevel.L1
"""The device tier, warmed with the chunks engines load (when the cache has one)."""


@dataclass(frozen=True, slots=True)
class LookupOutcome:
    """What an engine's lookup found and started.

    Attributes:
        result: per tier, and over all tiers, the contiguous cached prefix.
        prefetch: the promotions of the cached prefix into the shared-memory tier; None when none was asked
            for or the whole prefix is there already.
    """

    result: LookupResult
    prefetch: Prefetch | None


class EngineRules:
    """The engine-facing rules over one cache manager (stateless; thread-safe as the manager is)."""

    def __init__(self, manager: CacheManager) -> None:
        """Args: manager: the cache."""
        self._manager = manager

    @property
    def shared_level(self) -> TierLevel:
        """The tier whose slots engines map (loads lease there, stores land there)."""
        return SHARED_LEVEL

    def begin_shared_store(
        self, namespace_id: bytes, keys: Sequence[bytes], ttl_s: float | None, start_depth: int
    ) -> StoreTicket:
        """Reserve shared-memory slots for the chunks of ``keys`` not cached yet.

        A reservation the manager could only make below the shared-memory tier is aborted: the engine could
        not reach those buffers.

        Raises:
            CapacityError: no room in the shared-memory tier (the message names ``keys``), or none anywhere.
            NotFoundError, InvalidArgumentError: from the manager (unknown namespace, malformed keys, TTL,
                depth).
        """
        ticket = self._manager.begin_store(namespace_id, keys, SHARED_LEVEL, ttl_s, start_depth)
        if ticket.slots and ticket.level != SHARED_LEVEL:
            self._manager.abort_store(ticket.ticket_id)
            raise CapacityError(
                f"keys: no room in the shared-memory tier for {len(ticket.slots)} chunks (everything there is "
                "leased, pinned or too young); retry later"
            )
        return ticket

    def begin_stream_store(self, namespace_id: bytes, keys: Sequence[bytes], start_depth: int) -> StoreTicket:
        """Reserve space for chunks whose bytes arrive as a stream (in L2, else a slower tier): the whole key
        chain of a stream at once when the client named it up front, else one chunk per call.

        Raises:
            CapacityError, NotFoundError, InvalidArgumentError: from the manager (``keys``: a key twice).
        """
        return self._manager.begin_store(namespace_id, keys, SHARED_LEVEL, None, start_depth)

    def lookup(self, namespace_id: bytes, keys: Sequence[bytes], prefetch: bool) -> LookupOutcome:
        """An engine's lookup (counted in the token-weighted statistics).

        Args:
            namespace_id: the namespace.
            keys: the key chain.
            prefetch: start promoting the cached prefix into the shared-memory tier when part of it is
                only in slower tiers.

        Raises:
            NotFoundError, InvalidArgumentError: from the manager.
        """
        result = self._manager.lookup(namespace_id, keys, True)
        started = None
        if prefetch and self.wants_prefetch(result):
            started = self.prefetch(namespace_id, keys[: result.chunks])
        return LookupOutcome(result, started)

    def lookup_now(self, namespace_id: bytes, keys: Sequence[bytes]) -> LookupResult | None:
        """An engine's lookup (counted) if it answers without waiting (never blocks; None: run :meth:`lookup`
        in an executor). See :meth:`CacheManager.lookup_now`.

        Raises:
            NotFoundError, InvalidArgumentError: from the manager.
        """
        return self._manager.lookup_now(namespace_id, keys)

    @staticmethod
    def wants_prefetch(result: LookupResult) -> bool:
        """Whether part of a looked-up prefix is only in tiers slower than shared memory."""
        return result.by_tier.get(SHARED_LEVEL, 0) < result.chunks

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes]) -> Prefetch:
        """Start promoting the cached prefix of ``keys`` into the shared-memory tier.

        Raises:
            NotFoundError, InvalidArgumentError: from the manager.
        """
        return self._manager.prefetch(namespace_id, keys, SHARED_LEVEL)

    def lease(self, namespace_id: bytes, keys: Sequence[bytes]) -> LoadTicket:
        """Lease the cached prefix of ``keys`` in the shared-memory tier (promoting it first), default TTL.

        Raises:
            NotFoundError, InvalidArgumentError: from the manager.
        """
        return self._manager.acquire(namespace_id, keys, SHARED_LEVEL, None)

    def warm_after_load(
        self, namespace_id: bytes, keys: Sequence[bytes], ticket: LoadTicket
    ) -> Prefetch | None:
        """Keep a copy of a load's leased prefix in the device tier too (promotions run in the background).

        Loaded chunks are hot: a second copy in the fastest tier outlives an eviction from shared memory. The
        promotions are single-flight and bounded in bytes by the manager's prefetcher.

        Args:
            namespace_id: the namespace of the load.
            keys: the load's key chain.
            ticket: the load's lease.

        Returns:
            The promotions; None when nothing was leased or the cache has no device tier.
        """
        if not ticket.lease_id or DEVICE_LEVEL not in self._manager.levels:
            return None
        return self._manager.prefetch(namespace_id, keys[: len(ticket.chunks)], DEVICE_LEVEL)

"""The lease and store-ticket table, reaped at TTL.

A lease holds chunks of one slot tier for a reader; a store ticket holds reservations that a writer fills
before commit. Both carry an expiry time: a caller that dies cannot hold space forever. Expiries sit in a
min-heap (lazily invalidated when a lease or ticket ends first), so reaping costs O(log n) per expired item
and nothing when none is due.

The table only keeps the books; the manager drops the holds and aborts the reservations of what
:meth:`LeaseTable.reap` returns. It remembers the ids of the last :data:`LAPSED_REMEMBERED` tickets reaped
at their TTL, so that a late commit is told its ticket expired (not that it never existed). Not
thread-safe: every method runs under the cache's index lock.

Primitives:
    Lease: the chunks one reader holds in one tier.
    StoreReservation: the reservations of one store ticket.
    LeaseTable: new_id, add_lease / take_lease / lease, add_store / take_store / store, reap, lapsed,
        counts.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

from tiercache.ids import fresh_id
from tiercache.tiers.base import TierLevel, WriteSlot

LAPSED_REMEMBERED = 65_536
"""Expired store tickets whose ids (and expiry times) are remembered for a clear refusal of a late commit."""


@dataclass(slots=True)
class Lease:
    """Chunks held in one slot tier for a reader."""

    level: TierLevel
    chunk_ids: list[bytes]
    expires_at: float


@dataclass(slots=True)
class StoreReservation:
    """Reserved, invisible chunks of a store ticket, in parallel lists."""

    namespace_id: bytes
    level: TierLevel
    writes: list[WriteSlot]
    depths: list[int]
    indices: list[int]
    expires_at: float
    ttl: float = 0.0


class LeaseTable:
    """Open leases and store tickets by id."""

    def __init__(self) -> None:
        """An empty table."""
        self._leases: dict[int, Lease] = {}
        self._stores: dict[int, StoreReservation] = {}
        self._expiries: list[tuple[float, int]] = []
        self._lapsed: OrderedDict[int, float] = OrderedDict()
        self.expired = 0

    def new_id(self) -> int:
        """A fresh, unguessable id for a lease or a ticket (never 0, never one live or remembered as lapsed:
        :func:`~tiercache.ids.fresh_id`)."""
        return fresh_id(lambda i: i in self._leases or i in self._stores or i in self._lapsed)

    @property
    def active_leases(self) -> int:
        """Open leases."""
        return len(self._leases)

    def leases(self) -> list[Lease]:
        """Open leases (for invariant checks)."""
        return list(self._leases.values())

    def stores(self) -> list[StoreReservation]:
        """Open store tickets."""
        return list(self._stores.values())

    def add_lease(self, lease_id: int, lease: Lease) -> None:
        """Open a lease."""
        self._leases[lease_id] = lease
        heapq.heappush(self._expiries, (lease.expires_at, lease_id))

    def lease(self, lease_id: int) -> Lease | None:
        """An open lease."""
        return self._leases.get(lease_id)

    def take_lease(self, lease_id: int) -> Lease | None:
        """Close a lease; None when it is unknown or already closed."""
        return self._leases.pop(lease_id, None)

    def add_store(self, ticket_id: int, store: StoreReservation) -> None:
        """Open a store ticket."""
        self._stores[ticket_id] = store
        heapq.heappush(self._expiries, (store.expires_at, ticket_id))

    def store(self, ticket_id: int) -> StoreReservation | None:
        """An open store ticket."""
        return self._stores.get(ticket_id)

    def take_store(self, ticket_id: int) -> StoreReservation | None:
        """Close a store ticket; None when it is unknown or already closed."""
        return self._stores.pop(ticket_id, None)

    def lapsed(self, ticket_id: int) -> float | None:
        """When a store ticket reaped at its TTL expired; None when it is not one of the remembered ones."""
        return self._lapsed.get(ticket_id)

    def take_all_stores(self) -> list[StoreReservation]:
        """Close every store ticket (at shutdown)."""
        stores = list(self._stores.values())
        self._stores.clear()
        return stores

    def reap(self, now: float) -> tuple[list[tuple[int, Lease]], list[tuple[int, StoreReservation]]]:
        """Close every lease and ticket whose expiry is at or before ``now``; returns them."""
        leases: list[tuple[int, Lease]] = []
        stores: list[tuple[int, StoreReservation]] = []
        while self._expiries and self._expiries[0][0] <= now:
            _, item_id = heapq.heappop(self._expiries)
            lease = self._leases.get(item_id)
            if lease is not None and lease.expires_at <= now:
                del self._leases[item_id]
                leases.append((item_id, lease))
                continue
            store = self._stores.get(item_id)
            if store is not None and store.expires_at <= now:
                del self._stores[item_id]
                stores.append((item_id, store))
                self._lapsed[item_id] = store.expires_at
                if len(self._lapsed) > LAPSED_REMEMBERED:
                    self._lapsed.popitem(last=False)
        self.expired += len(leases) + len(stores)
        if len(self._expiries) > 2 * (len(self._leases) + len(self._stores)) + 64:
            self._expiries = [(ls.expires_at, i) for i, ls in self._leases.items()]
            self._expiries += [(st.expires_at, i) for i, st in self._stores.items()]
            heapq.heapify(self._expiries)
        return leases, stores

"""The prefetches still running, by id, so that an engine whose request went away can cancel them.

A Prefetch RPC (or a Lookup with ``prefetch``) whose promotions have not all finished gets an id; the
promotions' core :class:`~tiercache.cache.Prefetch` object is kept under it, owned by the caller's handle
(handles are tenant-scoped). An entry is dropped as soon as its last promotion finishes (a done callback on
the event loop), when it is cancelled, or — the table being bounded per tenant — when it is its tenant's
oldest and the tenant has a full share of the table (its promotions then run to completion but can no longer
be cancelled): one tenant's prefetches never push another's out. Ids are unguessable (:mod:`tiercache.ids`).

Used from the event loop only (no locks).

Primitives:
    PrefetchTable: ``add(handle, prefetch, tenant) -> id``, ``cancel(id, handle)``, ``len``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from tiercache.cache import Prefetch
from tiercache.ids import fresh_id

from .fairness import FairShares

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Entry:
    handle: bytes
    prefetch: Prefetch
    tenant: str


class PrefetchTable:
    """Running prefetches by id."""

    def __init__(self, capacity: int = FairShares().prefetches) -> None:
        """Args: capacity: entries kept at most per tenant."""
        self._capacity = capacity
        self._entries: dict[int, _Entry] = {}
        self._by_tenant: dict[str, OrderedDict[int, None]] = {}

    def add(self, handle: bytes, prefetch: Prefetch, tenant: str = "") -> int:
        """Keep a prefetch under a new id; 0 (nothing kept) when all its promotions have finished.

        Must be called on the event loop: the entry is dropped there when the last promotion finishes.
        """
        pending = [f for f in prefetch.futures if not f.done()]
        if not pending:
            return 0
        ident = fresh_id(self._entries.__contains__)  # unguessable: tiercache.ids
        self._entries[ident] = _Entry(handle, prefetch, tenant)
        own = self._by_tenant.setdefault(tenant, OrderedDict())
        own[ident] = None
        while len(own) > self._capacity:
            old, _ = own.popitem(last=False)
            del self._entries[old]
            logger.debug("prefetch share of %r full: prefetch %d can no longer be cancelled", tenant, old)
        done = asyncio.gather(*(asyncio.wrap_future(f) for f in pending), return_exceptions=True)
        done.add_done_callback(lambda _f: self._drop(ident))
        return ident

    def _drop(self, ident: int) -> _Entry | None:
        entry = self._entries.pop(ident, None)
        if entry is not None:
            self._by_tenant[entry.tenant].pop(ident, None)
        return entry

    def cancel(self, ident: int, handle: bytes) -> int | None:
        """Cancel the promotions of prefetch ``ident`` that have not started.

        Returns:
            How many were dropped; None when ``ident`` is not a running prefetch of ``handle``.
        """
        entry = self._entries.get(ident)
        if entry is None or entry.handle != handle:
            return None
        self._drop(ident)
        return entry.prefetch.cancel()

    def __len__(self) -> int:
        return len(self._entries)

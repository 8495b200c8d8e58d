"""The prefetches still running, by id, so that an engine whose request went away can cancel them.

A Prefetch RPC (or a Lookup with ``prefetch``) whose promotions have not all finished gets an id; the
promotions' core :class:`~tiercache.cache.Prefetch` object is kept under it, owned by the caller's handle
(handles are tenant-scoped). An entry is dropped as soon as its last promotion finishes (a done callback on
the event loop), when it is cancelled, or — the table being bounded — when it is the oldest of a full table
(its promotions then run to completion but can no longer be cancelled).

Used from the event loop only (no locks).

Primitives:
    PrefetchTable: ``add(handle, prefetch) -> id``, ``cancel(id, handle)``, ``len``.
    MAX_PREFETCHES: the default bound.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass

from tiercache.cache import Prefetch

logger = logging.getLogger(__name__)

MAX_PREFETCHES = 4096
"""Prefetches remembered at most (all tenants together)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    handle: bytes
    prefetch: Prefetch


class PrefetchTable:
    """Running prefetches by id."""

    def __init__(self, capacity: int = MAX_PREFETCHES) -> None:
        """Args: capacity: entries kept at most."""
        self._capacity = capacity
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._ids = itertools.count(1)

    def add(self, handle: bytes, prefetch: Prefetch) -> int:
        """Keep a prefetch under a new id; 0 (nothing kept) when all its promotions have finished.

        Must be called on the event loop: the entry is dropped there when the last promotion finishes.
        """
        pending = [f for f in prefetch.futures if not f.done()]
        if not pending:
            return 0
        ident = next(self._ids)
        self._entries[ident] = _Entry(handle, prefetch)
        while len(self._entries) > self._capacity:
            old, _ = self._entries.popitem(last=False)
            logger.debug("prefetch table full: prefetch %d can no longer be cancelled", old)
        done = asyncio.gather(*(asyncio.wrap_future(f) for f in pending), return_exceptions=True)
        done.add_done_callback(lambda _f: self._entries.pop(ident, None))
        return ident

    def cancel(self, ident: int, handle: bytes) -> int | None:
        """Cancel the promotions of prefetch ``ident`` that have not started.

        Returns:
            How many were dropped; None when ``ident`` is not a running prefetch of ``handle``.
        """
        entry = self._entries.get(ident)
        if entry is None or entry.handle != handle:
            return None
        del self._entries[ident]
        return entry.prefetch.cancel()

    def __len__(self) -> int:
        return len(self._entries)

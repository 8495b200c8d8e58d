"""Chunk-event listeners: who is told of every chunk stored in or removed from a tier.

The index announces each change as a :class:`~tiercache.stats.ChunkEvent` under the cache's index lock;
listeners are called there, in subscription order, so they see the changes in the order they happened. A
listener that raises is logged and skipped: one bad subscriber never breaks a store or an eviction.

Primitives:
    Listeners: add (returns an unsubscribe function), emit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tiercache.cache.results import Listener
from tiercache.stats import ChunkEvent

logger = logging.getLogger(__name__)


class Listeners:
    """Subscribed listeners, guarded by the cache's index lock."""

    def __init__(self, lock: threading.RLock) -> None:
        """Args: lock: the cache's index lock."""
        self._lock = lock
        self._listeners: list[Listener] = []

    def add(self, listener: Listener) -> Callable[[], None]:
        """Subscribe ``listener``; returns the function that unsubscribes it (idempotent)."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def emit(self, event: ChunkEvent) -> None:
        """Call every listener with ``event`` (under the index lock)."""
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("chunk event listener failed")

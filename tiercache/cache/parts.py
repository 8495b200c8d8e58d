"""The parts of a cache that its stores and its loads both work with, handed over as one value.

Primitives:
    Parts: the index lock, the clock, the tiers, the index, the lease table, the mover, the write policy,
        the write-back worker and the reaper of expired leases and tickets.
    held_if_free: hold a lock only if no other thread does (for callers that must never wait on it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from tiercache.cache.index import Index
from tiercache.cache.leases import LeaseTable
from tiercache.cache.mover import Mover
from tiercache.cache.writeback import WriteBack
from tiercache.policies import WritePolicy
from tiercache.tiers.base import StorageTier, TierLevel


@dataclass(frozen=True, slots=True)
class Parts:
    """What :class:`~tiercache.cache.stores.Stores` and :class:`~tiercache.cache.loads.Loads` share.

    Attributes:
        lock: the index lock (see :mod:`tiercache.cache.manager` for what it guards).
        clock: the cache's monotonic clock.
        tiers: the tiers by level.
        index: residency, recency, holds, pins and counters.
        leases: the lease and store-ticket table.
        mover: the one data mover.
        writes: the write policy.
        writeback: the write-down worker.
        reap: reclaims expired leases and tickets (call under the lock).
    """

    lock: threading.RLock
    clock: Callable[[], float]
    tiers: Mapping[TierLevel, StorageTier]
    index: Index
    leases: LeaseTable
    mover: Mover
    writes: WritePolicy
    writeback: WriteBack
    reap: Callable[[float], None]


@contextlib.contextmanager
def held_if_free(lock: threading.RLock, wanted: bool = True) -> Iterator[bool]:
    """Hold ``lock`` for the ``with`` block if it can be taken at once (True), else hold nothing (False);
    ``wanted`` False: hold nothing (False) without trying."""
    free = wanted and lock.acquire(blocking=False)
    try:
        yield free
    finally:
        if free:
            lock.release()

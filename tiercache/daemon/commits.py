"""CommitStore on the event loop: a small commit that nothing in it can make wait runs at once, without an
executor hop.

A same-host store is two round trips (BeginStore, CommitStore) around the engine's copy, and each hop from
the event loop to the executor and back cost ~0.1-0.4 ms of a compare-sized store's ~3 ms on a busy 2-core
host. A commit is CPU work (the L2 checksum of each chunk, the index's bookkeeping), and both xxhash and the
bookkeeping hold the interpreter lock, so in the executor it stalls the loop all the same, only later. It
runs on the loop when all of these hold, else in the executor as before:

* the index lock is free and no shared tier is asked (``CacheManager.uncontended``): the lock is held for
  the whole commit, so the commit never waits for another thread;
* no tenant has quotas: a commit then trims the tenant back under its quota, which may demote (L3 I/O);
* the ticket is small: at most :data:`INLINE_COMMIT_CHUNKS` chunks and :data:`INLINE_COMMIT_BYTES` bytes
  to hash (about half a millisecond of the loop here), so that one engine's large store never holds every
  other engine's calls for long;
* the daemon knows how many chunks are left in the ticket (:class:`TicketSizes`, recorded at BeginStore).

The ticket's tier is L2 (BeginStore reserves nowhere else), whose commit is memory work only; its write-down
is scheduled, not run.

Primitives:
    INLINE_COMMIT_CHUNKS, INLINE_COMMIT_BYTES: the largest commit run on the loop.
    TicketSizes: the open chunks of each store ticket (bounded).
    commit_now: the commit at once, or None (nothing done: run it in the executor).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tiercache.cache import CacheManager

INLINE_COMMIT_CHUNKS = 64
"""The most chunks a commit on the event loop files (the index costs ~10-50 µs of the loop per chunk)."""

INLINE_COMMIT_BYTES = 16 << 20
"""The most chunk bytes a commit on the event loop hashes (xxh3-64: ~0.5-1 ms of the loop here)."""

TICKETS_REMEMBERED = 65_536
"""Open tickets whose size :class:`TicketSizes` remembers; the oldest are forgotten first (an engine that
died leaves its tickets open until their TTL): their commits go to the executor."""


class TicketSizes:
    """How many chunks each open store ticket still holds, as BeginStore granted them (bounded)."""

    def __init__(self, capacity: int = TICKETS_REMEMBERED) -> None:
        """Args: capacity: tickets remembered at most."""
        self._capacity = capacity
        self._chunks: OrderedDict[int, int] = OrderedDict()

    def add(self, ticket_id: int, chunks: int) -> None:
        """Record a new ticket of ``chunks`` open chunks."""
        self._chunks[ticket_id] = chunks
        while len(self._chunks) > self._capacity:
            self._chunks.popitem(last=False)

    def taking(self, ticket_id: int, indices: Sequence[int]) -> int | None:
        """The chunks a commit of ``indices`` (empty: every open one) takes out of the ticket, which then
        holds that many fewer (the whole ticket: it is forgotten); None when the ticket is not known."""
        left = self._chunks.get(ticket_id)
        if left is None:
            return None
        taken = min(len(set(indices)), left) if indices else left
        if taken >= left:
            del self._chunks[ticket_id]
        else:
            self._chunks[ticket_id] = left - taken
        return taken

    def forget(self, ticket_id: int) -> None:
        """Drop a ticket (aborted)."""
        self._chunks.pop(ticket_id, None)

    def __len__(self) -> int:
        return len(self._chunks)


def commit_now(
    manager: CacheManager,
    ticket_id: int,
    indices: Sequence[int] | None,
    chunks: int | None,
    chunk_bytes: int,
    quotas: bool,
) -> int | None:
    """``manager.commit_store(ticket_id, indices)`` at once if nothing in it can wait (see the module), else
    None with nothing done.

    Args:
        manager: the cache.
        ticket_id: the ticket.
        indices: the chain positions to publish (None: every open one).
        chunks: how many chunks the commit takes (:meth:`TicketSizes.taking`; None: not known).
        chunk_bytes: the bytes of one of its chunks.
        quotas: whether any tenant has quotas.

    Raises:
        what ``CacheManager.commit_store`` raises.
    """
    if (
        quotas
        or chunks is None
        or chunks > INLINE_COMMIT_CHUNKS
        or chunks * chunk_bytes > INLINE_COMMIT_BYTES
    ):
        return None
    with manager.uncontended() as free:
        return manager.commit_store(ticket_id, indices) if free else None

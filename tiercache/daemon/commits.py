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
* the ticket is open and the commit small: at most :data:`INLINE_COMMIT_CHUNKS` chunks and
  :data:`INLINE_COMMIT_BYTES` bytes to hash (about half a millisecond of the loop here; chunks whose
  checksums the engine sent, taken as it copied them, are not hashed and do not count), so that one
  engine's large store never holds every other engine's calls for long. The cache says how many chunks the
  ticket still holds (``CacheManager.open_store_chunks``, asked under the lock the commit then keeps).

The ticket's tier is L2 (BeginStore reserves nowhere else), whose commit is memory work only; its write-down
is scheduled, not run.

Primitives:
    INLINE_COMMIT_CHUNKS, INLINE_COMMIT_BYTES: the largest commit run on the loop.
    commit_now: the commit at once, or None (nothing done: run it in the executor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tiercache.cache import CacheManager

INLINE_COMMIT_CHUNKS = 64
"""The most chunks a commit on the event loop files (the index costs ~10-50 µs of the loop per chunk)."""

INLINE_COMMIT_BYTES = 16 << 20
"""The most chunk bytes a commit on the event loop hashes (xxh3-64: ~0.5-1 ms of the loop here)."""


def commit_now(
    manager: CacheManager,
    ticket_id: int,
    indices: Sequence[int] | None,
    chunk_bytes: int,
    quotas: bool,
    checksums: Mapping[int, int] | None = None,
) -> int | None:
    """``manager.commit_store(ticket_id, indices)`` at once if nothing in it can wait (see the module), else
    None with nothing done (an unknown or closed ticket too: the executor's commit reports it).

    Args:
        manager: the cache.
        ticket_id: the ticket.
        indices: the chain positions to publish (None: every open one).
        chunk_bytes: the bytes of one of its chunks.
        quotas: whether any tenant has quotas.
        checksums: chain position -> the checksum the engine took of that slot's bytes (not hashed here).

    Raises:
        what ``CacheManager.commit_store`` raises.
    """
    if quotas:
        return None
    with manager.uncontended() as free:
        if not free:
            return None
        left = manager.open_store_chunks(ticket_id)
        if left is None:
            return None
        chunks = min(len(set(indices)), left) if indices else left
        hashed = max(0, chunks - len(checksums or ()))
        if chunks > INLINE_COMMIT_CHUNKS or hashed * chunk_bytes > INLINE_COMMIT_BYTES:
            return None
        return manager.commit_store(ticket_id, indices, checksums)

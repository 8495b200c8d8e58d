"""Discovery: chunks other daemons put in the shared tier enter this cache's index when a chain asks for them.

The index knows what this daemon stored or read; the shared tier (:class:`~tiercache.tiers.shared.SharedTier`)
also holds what every other daemon of the fleet stored. Before a lookup, load, prefetch, plan or read, the
part of the chain after its locally cached prefix is asked of the shared tier in one round trip (with the
index lock released: it is a network call, bounded by the tier's timeouts and off at once while the tier
backs off); the contiguous run of chunks the store holds is indexed as residing in the shared tier, from
where the usual moves promote them (a shared hit becomes an L2 copy like an L3 hit). A chunk missing in the
middle ends the run, so contiguity holds; a chunk the cluster evicts later is a miss on read and leaves the
index then (:meth:`~tiercache.cache.mover.Mover.lost`).

Primitives:
    Discovery: extend(namespace_id, cids, nbytes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.mover import Mover
from tiercache.keys import split_chunk_id
from tiercache.tiers.base import StorageTier, TierLevel

logger = logging.getLogger(__name__)


class Discovery:
    """Indexes chunks found in the shared tier (does nothing in a cache without one)."""

    def __init__(
        self,
        lock: threading.RLock,
        tiers: Mapping[TierLevel, StorageTier],
        index: Index,
        mover: Mover,
        clock: Callable[[], float],
    ) -> None:
        """Args: the cache's index lock, tiers, index, mover (what is being stored) and clock."""
        self._lock = lock
        self._shared = tiers.get(TierLevel.SHARED)
        self._index = index
        self._mover = mover
        self._clock = clock

    def extend(self, namespace_id: bytes, cids: Sequence[bytes], nbytes: int) -> int:
        """Index the chunks of a chain (from depth 0) that only the shared tier holds, in one probe.

        Args:
            namespace_id: the chain's namespace id (the prefix of every id in ``cids``).
            cids: the chain's chunk ids, from its first chunk.
            nbytes: the byte size of one chunk of the namespace.

        Returns:
            How many chunks were newly indexed in the shared tier.
        """
        if self._shared is None or not cids:
            return 0
        with self._lock:
            start = next((i for i, cid in enumerate(cids) if self._index.visible(cid) is None), len(cids))
        if start == len(cids):
            return 0
        probe = list(cids[start:])
        present = self._shared.contains(probe)
        added = 0
        with self._lock:
            now = self._clock()
            for depth, (cid, there) in enumerate(zip(probe, present, strict=True), start=start):
                if self._index.visible(cid) is not None:
                    continue  # indexed meanwhile (a local store, another discovery): the chain goes on
                if not there or self._mover.known(cid):
                    break  # missing (the prefix ends here), or being written right now
                ns_id, _ = split_chunk_id(cid)
                if ns_id != bytes(namespace_id):
                    break
                self._index.add_residency(cid, ChunkEntry(ns_id, cid, depth, nbytes), TierLevel.SHARED, now)
                added += 1
        if added:
            logger.debug("found %d chunks of namespace %s in the shared tier", added, namespace_id.hex())
        return added

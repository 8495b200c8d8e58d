"""What the mover tests share: chunk ids, a real L1 + L3 pair under one Mover and Index, and a way to
put a chunk into a tier behind the cache's back (filled with its own number, so survivors check bit-exact)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from tiercache.cache.index import ChunkEntry, Index
from tiercache.cache.mover import Mover
from tiercache.cache.space import Space
from tiercache.keys import CHUNK_ID_BYTES
from tiercache.policies import LruPolicy, OnEvict
from tiercache.rates import RateEstimator
from tiercache.tiers.base import StorageTier, TierLevel

NBYTES = 1024
"""Bytes per test chunk (one L1 slot)."""


def cid(i: int) -> bytes:
    """Chunk id number ``i``."""
    return i.to_bytes(4, "big") * (CHUNK_ID_BYTES // 4)


def mover_over(tiers: dict[TierLevel, StorageTier]) -> tuple[Mover, Index]:
    """A Mover and its Index over ``tiers``, LRU eviction, demotion on evict, no listeners."""
    space = Space(tiers, LruPolicy(), 0.0)
    index = Index(list(tiers), space, lambda e: None)
    mover = Mover(
        threading.RLock(), tiers, index, space, OnEvict(), RateEstimator(), lambda: 0.0, lambda n: None
    )
    return mover, index


def store(index: Index, tiers: Mapping[TierLevel, StorageTier], level: TierLevel, i: int) -> None:
    """Write chunk ``i`` (every byte ``i``) into ``level`` and index the copy (a new tick)."""
    (ws,) = tiers[level].reserve([cid(i)], [NBYTES])
    ws.buffer.fill_(i)
    tiers[level].commit([ws])
    index.next_tick()
    entry = index.get(cid(i)) or ChunkEntry(b"n" * 16, cid(i), 0, NBYTES)
    index.add_residency(cid(i), entry, level, 0.0)


def intact(tier: StorageTier, ids: list[int]) -> bool:
    """Whether ``tier`` still holds chunks ``ids`` with their bytes unchanged."""
    bufs = [torch.empty(NBYTES, dtype=torch.uint8) for _ in ids]
    found = tier.read_into([cid(i) for i in ids], bufs)
    return all(found) and all(bool((b == i).all()) for i, b in zip(ids, bufs))

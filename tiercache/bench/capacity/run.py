"""``tiercache-bench capacity``: how much of an L2 tier's configured bytes a mix of chunk sizes really uses.

A slot tier hands out whole pages. With one page per slot (the slot sized for the largest chunk) a model
whose chunks are much smaller than the slot wastes most of each one; with small pages (the daemon's default,
64 KiB when it divides the slot) a chunk wastes under one page. This measures it on a real L2 tier (shared
memory, checksums on), for mixes of chunk sizes drawn log-uniformly (seeded), under each page size:

* **full**: chunks stored one at a time until the tier first refuses one (CapacityError); the share of the
  configured bytes then held by the chunks' own bytes (``TierUsage.payload_bytes``, what Stats and ``/metrics``
  report as utilisation);
* **churn**: further chunks stored the same way, the oldest deleted until each fits (a FIFO cache), the
  utilisation after every store: its median and range. Freed runs are reused by chunks of other sizes, so
  this is where fragmentation shows.

Every chunk's bytes are written (a pattern per chunk) and committed; at the end every chunk still held is
checked against its checksum, so a page handed out twice would fail the run.

Primitives:
    SizeMix: a named range of chunk sizes.
    DEFAULT_MIXES, UTILISATION_TARGET.
    CapacityConfig: what to run (validated).
    CapacityRow: one (mix, page size) result.
    run_capacity: run every mix under every page size.
"""

from __future__ import annotations

import math
import random
import secrets
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.errors import CapacityError
from tiercache.keys import CHUNK_ID_BYTES
from tiercache.tiers.host import HostTier, HostTierConfig

from ..common.tier_ops import RoundTripError

KIB, MIB = 1 << 10, 1 << 20
UTILISATION_TARGET = 0.9
"""Issue 13 item 2: any mix of chunk sizes uses at least this share of the configured bytes (small pages)."""


@dataclass(frozen=True)
class SizeMix:
    """Chunk sizes drawn log-uniformly from ``low`` to ``high`` bytes (both included)."""

    name: str
    low: int
    high: int


DEFAULT_MIXES = (
    SizeMix("2-8 MiB", 2 * MIB, 8 * MIB),
    SizeMix("64 KiB-1 MiB", 64 * KIB, MIB),
    SizeMix("256 KiB-32 MiB", 256 * KIB, 32 * MIB),
)
"""Models with mid-size chunks, small chunks, and chunks from small up to the slot size."""


@dataclass(frozen=True)
class CapacityConfig:
    """What ``capacity`` runs.

    Attributes:
        capacity_bytes: the L2 tier's configured bytes.
        slot_bytes: the largest chunk (the daemon's ``--slot-bytes``).
        page_sizes: page sizes to compare; 0 is one page per slot.
        mixes: the chunk-size mixes.
        churn_chunks: chunks stored after the tier is first full.
        seed: the sizes' seed (the same sizes under every page size).
    """

    capacity_bytes: int = 512 * MIB
    slot_bytes: int = 32 * MIB
    page_sizes: tuple[int, ...] = (64 * KIB, 0)
    mixes: tuple[SizeMix, ...] = DEFAULT_MIXES
    churn_chunks: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.slot_bytes <= 0 or self.capacity_bytes < self.slot_bytes:
            raise ValueError("capacity: the capacity must hold at least one slot of a positive size")
        if not self.page_sizes or any(p < 0 or p > self.slot_bytes for p in self.page_sizes):
            raise ValueError("capacity: page sizes must be 0 (one page per slot) up to the slot size")
        if not self.mixes or any(not 0 < m.low <= m.high <= self.slot_bytes for m in self.mixes):
            raise ValueError("capacity: each mix needs 0 < low <= high <= the slot size")
        if self.churn_chunks < 0:
            raise ValueError("capacity: churn chunks must be 0 or more")


@dataclass(frozen=True)
class CapacityRow:
    """One mix under one page size.

    Attributes:
        mix: the chunk sizes.
        page_bytes: the page size used (the slot size for one page per slot).
        full_chunks / full_utilisation: chunks held and payload / configured bytes at the first refusal.
        churn_median / churn_low / churn_high: utilisation after each churn store (0 when no churn).
        churned: chunks stored during the churn.
        target: the utilisation target (None for one page per slot: the reference, not a target).
    """

    mix: SizeMix
    page_bytes: int
    full_chunks: int
    full_utilisation: float
    churn_median: float
    churn_low: float
    churn_high: float
    churned: int
    target: float | None

    @property
    def met(self) -> bool | None:
        """Whether both figures reach the target (None when there is none)."""
        if self.target is None:
            return None
        churn_ok = self.churned == 0 or self.churn_median >= self.target
        return self.full_utilisation >= self.target and churn_ok


def _sizes(mix: SizeMix, count: int, seed: int) -> list[int]:
    rng = random.Random(f"{seed}:{mix.low}:{mix.high}")
    lo, hi = math.log(mix.low), math.log(mix.high)
    return [min(mix.high, max(mix.low, round(math.exp(rng.uniform(lo, hi))))) for _ in range(count)]


def _chunk_id(i: int) -> bytes:
    return i.to_bytes(CHUNK_ID_BYTES, "big")


class _Filler:
    """Stores chunks into one tier, oldest deleted first when one does not fit."""

    def __init__(self, tier: HostTier) -> None:
        self.tier = tier
        self.held: deque[bytes] = deque()
        self.stored = 0

    def store(self, size: int, evict: bool) -> bool:
        """Store one chunk of ``size`` bytes; False when it did not fit and ``evict`` is off."""
        cid = _chunk_id(self.stored)
        while True:
            try:
                slot = self.tier.reserve([cid], [size])[0]
                break
            except CapacityError:
                if not evict:
                    return False
                if not self.held:
                    raise
                self.tier.delete([self.held.popleft()])
        slot.buffer.fill_(self.stored % 251)
        self.tier.commit([slot])
        self.held.append(cid)
        self.stored += 1
        return True

    def utilisation(self) -> float:
        usage = self.tier.usage()
        return usage.payload_bytes / usage.capacity_bytes

    def check(self) -> None:
        """Every chunk still held matches its checksum (no page was handed out twice)."""
        bad = [cid for cid in self.held if not self.tier.verify(cid)]
        if bad:
            raise RoundTripError(f"{len(bad)} of {len(self.held)} chunks changed after their commit")


def _measure(config: CapacityConfig, mix: SizeMix, page_bytes: int, sizes: Sequence[int]) -> CapacityRow:
    tier_config = HostTierConfig(
        config.capacity_bytes,
        config.slot_bytes,
        segment_prefix=f"tcbench-capacity-{secrets.token_hex(4)}",
        pin=False,
        prefault=False,
        page_bytes=page_bytes,
    )
    tier = HostTier(tier_config)
    try:
        filler = _Filler(tier)
        it = iter(sizes)
        for size in it:
            if not filler.store(size, evict=False):
                break
        full_chunks, full = len(filler.held), filler.utilisation()
        churn = []
        for size in it:
            filler.store(size, evict=True)
            churn.append(filler.utilisation())
            if len(churn) == config.churn_chunks:
                break
        filler.check()
    finally:
        tier.close()
    return CapacityRow(
        mix=mix,
        page_bytes=tier_config.page_size,
        full_chunks=full_chunks,
        full_utilisation=full,
        churn_median=statistics.median(churn) if churn else 0.0,
        churn_low=min(churn, default=0.0),
        churn_high=max(churn, default=0.0),
        churned=len(churn),
        target=UTILISATION_TARGET if tier_config.page_size < config.slot_bytes else None,
    )


def run_capacity(config: CapacityConfig) -> list[CapacityRow]:
    """Every mix under every page size, in that order."""
    rows = []
    for mix in config.mixes:
        # enough sizes to fill the tier with the smallest chunks, then churn
        sizes = _sizes(mix, config.capacity_bytes // mix.low + 1 + config.churn_chunks, config.seed)
        for page in config.page_sizes:
            rows.append(_measure(config, mix, page, sizes))
    return rows

"""Which ceiling each tier figure is compared against, and the ratio it should reach.

Targets (from the design's performance goals):
    L2 put and get >= 0.8x memcpy for chunks of 1 MiB and more;
    L3 put >= 0.7x the buffered disk write (final fsync included);
    L3 hot get (data in the page cache) >= 0.9x a raw py-lmdb get-and-copy of the same bytes (memcpy is
    out of reach through a 4 KiB-paged file map, so it and the disk read are shown, untargeted);
    SHARED put and get >= 0.8x raw redis-py SET / GET of the same bytes on the same store.
L1 is shown against memcpy on its own device, untargeted.

Every figure and ceiling is measured in several rounds, each tier's round right after a pass of every
ceiling; a ratio is the median of the per-round ratios (``figure[i] / ceiling[i]``), with the lowest and
highest next to it, so that one noisy moment cannot decide it.

Primitives:
    Rule: one (tier, op) -> ceiling comparison and its target.
    RULES: the rules above, in table order.
    Comparison: one figure divided by one ceiling, with its target and whether it is met.
    median_round: which round holds the median of a figure (the one reported).
    compare: the comparisons of one tier figure's rounds against the ceilings of the same rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.tiers.base import TierLevel

from ..ceilings import DISK_DEVICE, CeilingKind, CeilingResult
from ..common.spread import paired_ratios
from ..common.tier_ops import Op, TierOpResult
from .lmdb_ceiling import LMDB_DEVICE
from .shared_ceiling import REDIS_DEVICE

_MIB = 1 << 20
_CEILING_DEVICES = {
    CeilingKind.REDIS_SET: REDIS_DEVICE,
    CeilingKind.REDIS_GET: REDIS_DEVICE,
    CeilingKind.LMDB_GET: LMDB_DEVICE,
}


@dataclass(frozen=True, slots=True)
class Rule:
    """Compare ``level``'s ``op`` against ceiling ``kind``.

    Attributes:
        level: the tier.
        op: put or get.
        kind: the ceiling (a memcpy is taken on the tier's own device).
        target: the ratio to reach, or None when only shown.
        min_chunk_bytes: the target applies from this chunk size on.
    """

    level: TierLevel
    op: Op
    kind: CeilingKind
    target: float | None = None
    min_chunk_bytes: int = 0


RULES: tuple[Rule, ...] = (
    Rule(TierLevel.L1, Op.PUT, CeilingKind.MEMCPY),
    Rule(TierLevel.L1, Op.GET, CeilingKind.MEMCPY),
    Rule(TierLevel.L2, Op.PUT, CeilingKind.MEMCPY, 0.8, _MIB),
    Rule(TierLevel.L2, Op.GET, CeilingKind.MEMCPY, 0.8, _MIB),
    Rule(TierLevel.L3, Op.PUT, CeilingKind.DISK_WRITE, 0.7),
    Rule(TierLevel.L3, Op.GET, CeilingKind.LMDB_GET, 0.9, 256 << 10),
    Rule(TierLevel.L3, Op.GET, CeilingKind.MEMCPY),
    Rule(TierLevel.L3, Op.GET, CeilingKind.DISK_READ),
    Rule(TierLevel.SHARED, Op.PUT, CeilingKind.REDIS_SET, 0.8),
    Rule(TierLevel.SHARED, Op.GET, CeilingKind.REDIS_GET, 0.8),
)
"""Every comparison the benchmark makes."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """A tier figure divided by a ceiling, round by round.

    Attributes:
        ceiling: the ceiling's label, e.g. ``memcpy(cpu)``.
        ceiling_gbps: the ceiling's throughput in its median round.
        ratio: the median of the per-round ratios figure GB/s / ceiling GB/s (the figure of record).
        target: the ratio to reach, or None when untargeted (or the chunk is below the rule's minimum).
        met: whether ``ratio >= target``; None when untargeted.
        low: the lowest round's ratio.
        high: the highest round's ratio.
        round_ratios: every round's ratio, in round order.
    """

    ceiling: str
    ceiling_gbps: float
    ratio: float
    target: float | None
    met: bool | None
    low: float
    high: float
    round_ratios: tuple[float, ...]


def _find(
    ceilings: Sequence[CeilingResult], kind: CeilingKind, device: str, chunk_bytes: int
) -> CeilingResult:
    for c in ceilings:
        if c.kind is kind and c.device == device and c.chunk_bytes == chunk_bytes:
            return c
    raise LookupError(f"no {kind.value} ceiling on {device} for {chunk_bytes}-byte chunks was measured")


def median_round(values: Sequence[float]) -> int:
    """The index of the median value (the lower middle one of an even count)."""
    if not values:
        raise ValueError("no rounds")
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def compare(
    rounds: Sequence[TierOpResult], ceilings: Sequence[Sequence[CeilingResult]]
) -> tuple[Comparison, ...]:
    """Every comparison :data:`RULES` define for one tier figure measured in several rounds.

    Args:
        rounds: the figure's rounds (one tier, op and chunk size), in order.
        ceilings: per round, the ceilings measured in that round (paired with ``rounds`` by position).

    Raises:
        LookupError: a ceiling the rules need was not measured in some round.
        ValueError: no rounds, or not one ceiling set per round.
    """
    if not rounds or len(rounds) != len(ceilings):
        raise ValueError(f"need one ceiling set per round: {len(rounds)} rounds, {len(ceilings)} sets")
    first = rounds[0]
    out = []
    for rule in RULES:
        if rule.level is not first.level or rule.op is not first.op:
            continue
        device = (
            first.device if rule.kind is CeilingKind.MEMCPY else _CEILING_DEVICES.get(rule.kind, DISK_DEVICE)
        )
        matched = [_find(cs, rule.kind, device, first.chunk_bytes) for cs in ceilings]
        ceiling_gbps = [c.timing.gbps for c in matched]
        spread = paired_ratios([r.timing.gbps for r in rounds], ceiling_gbps)
        ratios = tuple(r.timing.gbps / g for r, g in zip(rounds, ceiling_gbps, strict=True))
        target = rule.target if first.chunk_bytes >= rule.min_chunk_bytes else None
        met = None if target is None else spread.median >= target
        median = matched[median_round(ceiling_gbps)]
        out.append(
            Comparison(
                median.label, median.timing.gbps, spread.median, target, met, spread.low, spread.high, ratios
            )
        )
    return tuple(out)

"""Which ceiling each tier figure is compared against, and the ratio it should reach.

Targets (from the design's performance goals):
    L2 put and get >= 0.8x memcpy for chunks of 1 MiB and more;
    L3 put >= 0.7x the buffered disk write (final fsync included);
    L3 hot get (data in the page cache) >= 0.7x memcpy; it is also shown against the disk read, untargeted;
    SHARED put and get >= 0.8x raw redis-py SET / GET of the same bytes on the same store.
L1 is shown against memcpy on its own device, untargeted.

Primitives:
    Rule: one (tier, op) -> ceiling comparison and its target.
    RULES: the rules above, in table order.
    Comparison: one figure divided by one ceiling, with its target and whether it is met.
    compare: the comparisons of one tier result against the measured ceilings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiercache.tiers.base import TierLevel

from .ceilings import DISK_DEVICE, CeilingKind, CeilingResult
from .shared_ceiling import REDIS_DEVICE
from .tiers import Op, TierOpResult

_MIB = 1 << 20
_CEILING_DEVICES = {CeilingKind.REDIS_SET: REDIS_DEVICE, CeilingKind.REDIS_GET: REDIS_DEVICE}


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
    Rule(TierLevel.L3, Op.GET, CeilingKind.MEMCPY, 0.7),
    Rule(TierLevel.L3, Op.GET, CeilingKind.DISK_READ),
    Rule(TierLevel.SHARED, Op.PUT, CeilingKind.REDIS_SET, 0.8),
    Rule(TierLevel.SHARED, Op.GET, CeilingKind.REDIS_GET, 0.8),
)
"""Every comparison the benchmark makes."""


@dataclass(frozen=True, slots=True)
class Comparison:
    """A tier figure divided by a ceiling.

    Attributes:
        ceiling: the ceiling's label, e.g. ``memcpy(cpu)``.
        ceiling_gbps: the ceiling's throughput.
        ratio: figure GB/s / ceiling GB/s.
        target: the ratio to reach, or None when untargeted (or the chunk is below the rule's minimum).
        met: whether ``ratio >= target``; None when untargeted.
    """

    ceiling: str
    ceiling_gbps: float
    ratio: float
    target: float | None
    met: bool | None


def _find(
    ceilings: Sequence[CeilingResult], kind: CeilingKind, device: str, chunk_bytes: int
) -> CeilingResult:
    for c in ceilings:
        if c.kind is kind and c.device == device and c.chunk_bytes == chunk_bytes:
            return c
    raise LookupError(f"no {kind.value} ceiling on {device} for {chunk_bytes}-byte chunks was measured")


def compare(result: TierOpResult, ceilings: Sequence[CeilingResult]) -> tuple[Comparison, ...]:
    """Every comparison :data:`RULES` define for ``result``.

    Args:
        result: a tier's figure.
        ceilings: ceilings measured in the same run.

    Raises:
        LookupError: a ceiling the rules need was not measured.
    """
    out = []
    for rule in RULES:
        if rule.level is not result.level or rule.op is not result.op:
            continue
        device = (
            result.device if rule.kind is CeilingKind.MEMCPY else _CEILING_DEVICES.get(rule.kind, DISK_DEVICE)
        )
        ceiling = _find(ceilings, rule.kind, device, result.chunk_bytes)
        ratio = result.timing.gbps / ceiling.timing.gbps
        target = rule.target if result.chunk_bytes >= rule.min_chunk_bytes else None
        met = None if target is None else ratio >= target
        out.append(Comparison(ceiling.label, ceiling.timing.gbps, ratio, target, met))
    return tuple(out)

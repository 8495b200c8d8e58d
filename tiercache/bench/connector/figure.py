"""The figures of ``tiercache-bench connector``: one measured figure next to its baseline, and the targets.

Primitives:
    STORE_LOAD_TARGET, LOOKUP_TARGET, STREAM_TARGET: the targets (issue 3 / issue 13).
    ConnectorFigure: one figure next to its baseline, ratio and target.
    throughput_figure: a GB/s figure of a path against a baseline.
    BenchError: the daemon refused or lost data (not a corruption: e.g. no room, no data plane).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiercache.layout import KVLayout

from ..common.layout_cases import LayoutCase
from ..common.spread import RatioSpread
from ..common.timing import Latency, Timing

STORE_LOAD_TARGET = 0.8
"""Same-host store and load, as a ratio to memcpy."""
LOOKUP_TARGET = 2.0
"""Lookup p50, as a ratio to a bare echo (at most)."""
STREAM_TARGET = 0.8
"""Byte-stream store and load, as a ratio to the bare one-way stream."""


@dataclass(frozen=True, slots=True)
class ConnectorFigure:
    """One connector figure next to its baseline.

    Attributes:
        case: the layout case's label.
        chunk_bytes: bytes per chunk.
        chunks: chunks per round.
        path: ``shm`` (same-host data plane), ``stream`` (byte stream) or ``rpc`` (lookup).
        op: ``store``, ``load`` or ``lookup``.
        unit: ``GB/s`` (throughput) or ``ms`` (p50 latency).
        value: the figure (GB/s, or the p50 latency in ms).
        baseline: the baseline's label (``memcpy(cpu)``, ``echo``, ``stream_sink``, ``stream_source``).
        baseline_value: the baseline in the same unit.
        ratio: value / baseline_value.
        target: the ratio to reach (at least, or at most for latencies), None when untargeted.
        at_most: the target is an upper bound (latency).
        met: whether the target is met (a throughput figure measured in rounds: by its median per-round
            ratio, the figure of record, since one slow ceiling pass or round must not decide it); None when
            untargeted.
        timing: throughput phases: their timing.
        latency: latency phases: the call's latency; ``baseline_latency`` the baseline's.
        baseline_latency: the echo latency of a lookup figure.
        verified_bytes: bytes compared equal to the stored KV (loads; stores are verified by their load).
        spread: throughput figures: the per-round ratios, each round to the ceiling pass (memcpy, or the
            bare stream) taken right before it (``baseline_value`` is then the ceiling of all those passes
            together); None otherwise.
    """

    case: str
    chunk_bytes: int
    chunks: int
    path: str
    op: str
    unit: str
    value: float
    baseline: str
    baseline_value: float
    ratio: float
    target: float | None
    at_most: bool
    met: bool | None
    timing: Timing | None = None
    latency: Latency | None = None
    baseline_latency: Latency | None = None
    verified_bytes: int = 0
    spread: RatioSpread | None = None


class BenchError(RuntimeError):
    """The daemon refused the run or lost data without corrupting it (no room, no data plane, ...)."""


def throughput_figure(
    case: LayoutCase,
    layout: KVLayout,
    chunks: int,
    path: str,
    op: str,
    timing: Timing,
    baseline: str,
    baseline_gbps: float,
    target: float,
    verified: int = 0,
    spread: RatioSpread | None = None,
) -> ConnectorFigure:
    """A GB/s figure of ``path`` / ``op`` against a baseline of ``baseline_gbps`` (at least ``target``)."""
    ratio = timing.gbps / baseline_gbps
    judged = spread.median if spread is not None else ratio
    return ConnectorFigure(
        case.label,
        layout.chunk_bytes,
        chunks,
        path,
        op,
        "GB/s",
        timing.gbps,
        baseline,
        baseline_gbps,
        ratio,
        target,
        False,
        judged >= target,
        timing=timing,
        verified_bytes=verified,
        spread=spread,
    )

"""Output of a ``scale`` run: the table, the JSON document and the lookup/eviction-vs-chunks chart.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_scale_report: one row per chunk count, each figure also as a ratio to the smallest count's.
    scale_to_dict: every figure, the machine and the config as JSON-ready values, with the targets.
    scale_charts: lookup p50 and evicting-store cost per chunk vs indexed chunks.
"""

from __future__ import annotations

from typing import Any

from ..common.documents import jsonable
from ..common.plot import Chart, Series
from ..tables import columns
from .run import LOOKUP_TARGET, MEMORY_TARGET_BYTES, RESTART_TARGET_S, ScaleFill, ScalePoint, ScaleReport

SCHEMA = "tiercache-bench/scale/1"
_FILLS = {
    ScaleFill.CACHE: "L2 slots of 1 KiB + L3 (write-through), filled through the cache",
    ScaleFill.BULK: "L3 of 1 KiB chunks written in bulk, the cache's warm start on it (L3 only, full)",
}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def _vs(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def _targets(report: ScaleReport) -> dict[str, Any]:
    first, last = report.points[0], report.points[-1]
    lookup_ratio = last.lookup.p50_s / first.lookup.p50_s if first.lookup.p50_s > 0 else None
    evict_ratio = last.evict_s_per_chunk / first.evict_s_per_chunk if first.evict_s_per_chunk > 0 else None
    return {
        "largest_chunks": last.chunks,
        "lookup_p50_ratio": lookup_ratio,
        "lookup_p50_ratio_target": LOOKUP_TARGET,
        "lookup_met": None if lookup_ratio is None else lookup_ratio <= LOOKUP_TARGET,
        "anon_bytes_per_chunk": last.anon_bytes_per_chunk,
        "anon_bytes_per_chunk_target": MEMORY_TARGET_BYTES,
        "memory_met": last.anon_bytes_per_chunk <= MEMORY_TARGET_BYTES,
        "evict_per_chunk_ratio": evict_ratio,
        "restart_s": last.restart_s,
        "restart_s_target": RESTART_TARGET_S,
        "restart_met": None if last.restart_s is None else last.restart_s <= RESTART_TARGET_S,
    }


def _row(p: ScalePoint, base: ScalePoint) -> list[str]:
    return [
        str(p.chunks),
        f"{p.fill_s:.1f}",
        _us(p.lookup.p50_s),
        _us(p.lookup.p99_s),
        _vs(p.lookup.p50_s, base.lookup.p50_s),
        f"{p.anon_bytes_per_chunk:.0f}",
        _us(p.evict_s_per_chunk),
        _vs(p.evict_s_per_chunk, base.evict_s_per_chunk),
        "-" if p.restart_s is None else f"{p.restart_s:.2f}",
        "-" if p.restart_cpu_s is None else f"{p.restart_cpu_s:.2f}",
        "-" if p.restart_chunks is None else str(p.restart_chunks),
    ]


def format_scale_report(report: ScaleReport) -> str:
    """The human-readable result."""
    cfg, base = report.config, report.points[0]
    t = _targets(report)
    lines = [
        f"tiercache-bench scale — in-process cache, {_FILLS[cfg.fill]}; lookups of "
        f"{cfg.prompt_chunks} keys; {report.elapsed_s:.1f} s in all.",
        "'x first' columns are ratios to the smallest count. Memory is anonymous RSS grown per chunk (index, "
        "queues, allocator slack).",
        "",
        *columns(
            ["chunks", "fill s", "lookup p50 us", "p99 us", "x first", "B/chunk", "evict us/chunk",
             "x first", "restart s", "cpu s", "restart chunks"],
            [_row(p, base) for p in report.points],
            frozenset(),
        ),
        "",
        f"Targets at {t['largest_chunks']} chunks: lookup p50 <= {LOOKUP_TARGET}x the first "
        f"({'-' if t['lookup_p50_ratio'] is None else format(t['lookup_p50_ratio'], '.2f')}x); memory <= "
        f"{MEMORY_TARGET_BYTES} B/chunk ({t['anon_bytes_per_chunk']:.0f}); warm restart <= {RESTART_TARGET_S:.0f} s "
        f"({'-' if t['restart_s'] is None else format(t['restart_s'], '.2f')} s).",
    ]  # fmt: skip
    return "\n".join(lines)


def scale_to_dict(report: ScaleReport) -> dict[str, Any]:
    """Every figure of ``report`` with the machine, the config and the targets, as JSON-ready values."""
    return {
        "schema": SCHEMA,
        "command": "scale",
        "machine": jsonable(report.machine),
        "config": jsonable(report.config),
        "elapsed_s": report.elapsed_s,
        "points": [jsonable(p) for p in report.points],
        "targets": _targets(report),
    }


def scale_charts(report: ScaleReport) -> list[Chart]:
    """Lookup p50 and evicting-store cost per chunk (µs) vs indexed chunks."""
    ticks = tuple((float(p.chunks), str(p.chunks)) for p in report.points)
    return [
        Chart(
            "scale: cost vs indexed chunks",
            "chunks indexed",
            "microseconds",
            (
                Series("lookup p50", tuple((float(p.chunks), p.lookup.p50_s * 1e6) for p in report.points)),
                Series(
                    "evicting store, per chunk",
                    tuple((float(p.chunks), p.evict_s_per_chunk * 1e6) for p in report.points),
                ),
            ),
            log_x=len(report.points) > 1,
            x_ticks=ticks,
        )
    ]

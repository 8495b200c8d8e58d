"""Output of a ``tiers`` run: a plain-text table for people and a JSON document for tools.

Primitives:
    format_report: the ceilings table and the tiers table (aligned plain-text columns).
    report_to_dict: every figure, the machine and the config as JSON-ready values.
    tiers_charts: GB/s vs chunk size per tier and op, with the ceilings dashed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ..common.plot import Chart, Series
from ..common.timing import Timing
from ..tables import columns as _columns
from ..tables import format_size
from .checksum_ceiling import ChecksumRow
from .run import CeilingRow, TierRow, TiersReport

__all__ = ["SCHEMA", "format_report", "report_to_dict", "tiers_charts"]

SCHEMA = "tiercache-bench/tiers/1"
"""The ``schema`` field of the JSON document."""


def _range(values: Sequence[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _ceiling_lines(ceilings: Sequence[CeilingRow]) -> list[str]:
    rows = [
        [
            row.ceiling.label,
            format_size(row.ceiling.chunk_bytes),
            f"{row.ceiling.timing.gbps:.2f}",
            _range(row.round_gbps),
            f"{row.ceiling.timing.p50_ms:.3f}",
            f"{row.ceiling.timing.p99_ms:.3f}",
            row.ceiling.note,
        ]
        for row in ceilings
    ]
    headers = ["ceiling", "chunk", "GB/s", "rounds", "p50 ms", "p99 ms", "note"]
    return _columns(headers, rows, frozenset({0, 6}))


def _checksum_lines(rows: Sequence[ChecksumRow]) -> list[str]:
    out = [
        [
            row.method.value + (" (tiers use this)" if row.in_use else ""),
            format_size(row.chunk_bytes),
            f"{row.gbps:.2f}",
            f"{row.ratio:.2f}x",
            f"{row.low:.2f}-{row.high:.2f}",
        ]
        for row in rows
    ]
    return _columns(["checksum", "chunk", "GB/s", "vs memcpy", "rounds"], out, frozenset({0}))


def _tier_lines(rows: Sequence[TierRow]) -> list[str]:
    out = []
    for row in rows:
        r = row.result
        first = [r.level.name, r.op.value, format_size(r.chunk_bytes), f"{r.timing.gbps:.2f}"]
        first += [f"{r.timing.p50_ms:.3f}", f"{r.timing.p99_ms:.3f}"]
        for i, c in enumerate(row.comparisons):
            head = first if i == 0 else ["", "", "", "", "", ""]
            target = "-" if c.target is None else f">={c.target:.1f}x"
            met = "-" if c.met is None else ("yes" if c.met else "NO")
            ratio = [f"{c.ratio:.2f}x", f"{c.low:.2f}-{c.high:.2f}"]
            out.append([*head, c.ceiling, f"{c.ceiling_gbps:.2f}", *ratio, target, met])
    headers = [
        "tier",
        "op",
        "chunk",
        "GB/s",
        "p50 ms",
        "p99 ms",
        "vs ceiling",
        "ceil GB/s",
        "ratio",
        "rounds",
        "target",
        "met?",
    ]
    return _columns(headers, out, frozenset({0, 1, 6, 10, 11}))


def format_report(report: TiersReport) -> str:
    """The human-readable result: the ceilings, then every tier figure against its ceilings."""
    opts = report.config.options
    per_call = f"p50/p99 are per call; one call = one batch of up to {opts.batch} chunks"
    lines = [
        f"tiercache-bench tiers — {report.machine.cpu_count} CPUs ({report.machine.torch_threads} torch threads), "
        f"L1 on {report.machine.device}, "
        f"L3 in {report.machine.work_dir} ({report.machine.filesystem}), codec {opts.codec.value}, "
        f"durable={opts.durable}",
        f"GB/s = 1e9 bytes/s over the whole phase; {per_call}; {report.elapsed_s:.1f} s in all.",
        f"{report.config.rounds} rounds per size (every ceiling, then every tier); GB/s is the median round, "
        "a ratio the median of the per-round ratios, with the lowest-highest round next to it.",
        "",
        "Machine ceilings",
        *_ceiling_lines(report.ceilings),
        "",
        "Tiers (put = reserve + commit_from the payload: copied into slot buffers, except SHARED, which "
        "writes from the source; get = read_into a preallocated buffer)",
        *_tier_lines(report.rows),
        "",
        "Checked bytes (one pass of each over the payload's chunks, every round; vs the same round's memcpy)",
        *_checksum_lines(report.checksums),
    ]
    missed = [
        f"{row.result.level.name} {row.result.op.value} {format_size(row.result.chunk_bytes)} vs {c.ceiling}"
        for row in report.rows
        for c in row.comparisons
        if c.met is False
    ]
    lines.append("")
    lines.append("All targets met." if not missed else f"Targets missed: {'; '.join(missed)}.")
    return "\n".join(lines)


def _timing_dict(timing: Timing) -> dict[str, Any]:
    return {
        "gbps": timing.gbps,
        "p50_ms": timing.p50_ms,
        "p99_ms": timing.p99_ms,
        "total_bytes": timing.total_bytes,
        "calls": timing.calls,
        "seconds": timing.seconds,
    }


def report_to_dict(report: TiersReport) -> dict[str, Any]:
    """Every figure of ``report``, plus the machine and the config, as JSON-ready values."""
    cfg = report.config
    opts = cfg.options
    results = []
    for row in report.rows:
        r = row.result
        results.append(
            {
                "tier": r.level.name,
                "op": r.op.value,
                "device": r.device,
                "chunk_bytes": r.chunk_bytes,
                **_timing_dict(r.timing),
                "round_gbps": list(row.round_gbps),
                "verified_bytes": r.verified_bytes,
                "comparisons": [asdict(c) for c in row.comparisons],
            }
        )
    return {
        "schema": SCHEMA,
        "machine": asdict(report.machine),
        "config": {
            "tiers": [lv.name for lv in cfg.levels],
            "chunk_sizes": list(cfg.chunk_sizes),
            "bytes_per_size": cfg.bytes_per_size,
            "work_root": None if cfg.work_root is None else str(cfg.work_root),
            "batch": opts.batch,
            "warmup_rounds": opts.warmup_rounds,
            "l1_device": opts.l1_device,
            "codec": opts.codec.value,
            "zstd_level": opts.zstd_level,
            "durable": opts.durable,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
        },
        "latency_unit": f"per call (one batch of up to {opts.batch} chunks)",
        "elapsed_s": report.elapsed_s,
        "ceilings": [
            {
                "kind": row.ceiling.kind.value,
                "device": row.ceiling.device,
                "label": row.ceiling.label,
                "chunk_bytes": row.ceiling.chunk_bytes,
                **_timing_dict(row.ceiling.timing),
                "round_gbps": list(row.round_gbps),
                "note": row.ceiling.note,
            }
            for row in report.ceilings
        ],
        "results": results,
        "checksums": [{**asdict(row), "method": row.method.value} for row in report.checksums],
        "targets_met": all(c.met is not False for row in report.rows for c in row.comparisons),
    }


def tiers_charts(report: TiersReport) -> list[Chart]:
    """One panel per op: GB/s vs chunk size per tier, and the ceilings dashed."""
    charts = []
    sizes = sorted(report.config.chunk_sizes)
    ticks = tuple((s, format_size(s)) for s in sizes)
    for op in ("put", "get"):
        series: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for row in report.rows:
            r = row.result
            if r.op.value == op:
                series.setdefault((f"{r.level.name} {op}", False), []).append((r.chunk_bytes, r.timing.gbps))
        wanted = {"memcpy"} | ({"disk_write"} if op == "put" else {"disk_read", "lmdb_get"})
        for c in (row.ceiling for row in report.ceilings):
            if c.kind.value in wanted:
                series.setdefault((c.label, True), []).append((c.chunk_bytes, c.timing.gbps))
        charts.append(
            Chart(
                f"tiers: {op} throughput vs chunk size",
                "chunk size",
                "GB/s",
                tuple(Series(label, tuple(pts), dashed) for (label, dashed), pts in series.items()),
                log_x=True,
                x_ticks=ticks,
            )
        )
    return charts

"""Output of a ``connector`` run: the table, the JSON document and the throughput-vs-chunk-size chart.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_connector_report: the ceilings and every figure next to its baseline, ratio and target.
    connector_to_dict: every figure, the machine, the daemon and the config as JSON-ready values.
    connector_charts: GB/s vs chunk size per path and op, with memcpy and the bare stream dashed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..common.documents import jsonable
from ..common.plot import Chart, Series
from ..tables import columns, format_size, met_text, ratio_text, target_text
from .run import ConnectorReport

SCHEMA = "tiercache-bench/connector/1"


def format_connector_report(report: ConnectorReport) -> str:
    """The human-readable result."""
    cfg = report.config
    where = "embedded daemon(s)" if report.daemon.embedded else f"daemon at {report.daemon.address}"
    head = [
        f"tiercache-bench connector — {report.machine.cpu_count} CPUs, {where}, {cfg.rounds} timed rounds per "
        f"path, ~{format_size(cfg.bytes_per_case)} per round; {report.elapsed_s:.1f} s in all.",
        "store/load = KVConnector with per-layer ContiguousKV tensors; shm = same-host shared memory, "
        "stream = byte stream (force_remote); every load verified byte for byte.",
        "",
        "Baselines measured in this run",
    ]
    ceil_rows = [
        [case, c.label, format_size(c.chunk_bytes), f"{c.timing.gbps:.2f}", c.note]
        for case, c in report.ceilings
    ]
    lines = head + columns(["case", "baseline", "chunk", "GB/s", "note"], ceil_rows, frozenset({0, 1, 4}))
    rows = []
    for f in report.figures:
        value = f"{f.value:.2f} GB/s" if f.unit == "GB/s" else f"{f.value:.3f} ms p50"
        base = f"{f.baseline_value:.2f} GB/s" if f.unit == "GB/s" else f"{f.baseline_value:.3f} ms p50"
        extra = "" if f.spread is None else f"per round {f.spread.text()}"
        if f.latency is not None and f.baseline_latency is not None:
            extra = f"p99 {f.latency.p99_ms:.3f} vs {f.baseline_latency.p99_ms:.3f} ms"
        rows.append(
            [
                f.case,
                format_size(f.chunk_bytes),
                str(f.chunks),
                f.path,
                f.op,
                value,
                f.baseline,
                base,
                ratio_text(f.ratio),
                target_text(f.target, f.at_most),
                met_text(f.met),
                extra,
            ]
        )
    headers = ["case", "chunk", "chunks", "path", "op", "figure", "vs", "baseline", "ratio", "target"]
    lines += ["", "Connector", *columns([*headers, "met?", ""], rows, frozenset({0, 3, 4, 6, 11}))]
    missed = [f"{f.case} {f.path} {f.op}" for f in report.figures if f.met is False]
    lines += ["", "All targets met." if not missed else f"Targets missed: {'; '.join(missed)}."]
    return "\n".join(lines)


def connector_to_dict(report: ConnectorReport) -> dict[str, Any]:
    """Every figure of ``report`` with the machine, daemon and config, as JSON-ready values."""
    cfg = report.config
    figures = []
    for f in report.figures:
        item = jsonable(dataclasses.replace(f, timing=None, latency=None, baseline_latency=None))
        for name in ("timing", "latency", "baseline_latency"):
            item.pop(name)
        if f.timing is not None:
            t = f.timing
            item.update(gbps=t.gbps, total_bytes=t.total_bytes, seconds=t.seconds, calls=t.calls)
            item.update(p50_ms=t.p50_ms, p99_ms=t.p99_ms)
        if f.latency is not None and f.baseline_latency is not None:
            item.update(p50_ms=f.latency.p50_ms, p99_ms=f.latency.p99_ms, calls=f.latency.calls)
            item.update(baseline_p50_ms=f.baseline_latency.p50_ms, baseline_p99_ms=f.baseline_latency.p99_ms)
        figures.append(item)
    return {
        "schema": SCHEMA,
        "command": "connector",
        "machine": jsonable(report.machine),
        "daemon": jsonable(report.daemon),
        "config": {
            "cases": jsonable(cfg.cases),
            "chunk_bytes": {c.label: c.layout().chunk_bytes for c in cfg.cases},
            "bytes_per_case": cfg.bytes_per_case,
            "rounds": cfg.rounds,
            "lookup_calls": cfg.lookup_calls,
            "stream": cfg.stream,
            "address": cfg.address,
            "embedded_daemon": jsonable(cfg.daemon) if cfg.address is None else None,
            "seed": cfg.seed,
        },
        "elapsed_s": report.elapsed_s,
        "ceilings": [
            {
                "case": case,
                "kind": c.kind.value,
                "label": c.label,
                "chunk_bytes": c.chunk_bytes,
                "gbps": c.timing.gbps,
                "total_bytes": c.timing.total_bytes,
                "seconds": c.timing.seconds,
                "note": c.note,
            }
            for case, c in report.ceilings
        ],
        "figures": figures,
        "targets_met": all(f.met is not False for f in report.figures),
    }


def connector_charts(report: ConnectorReport) -> list[Chart]:
    """GB/s vs chunk size: one line per path and op, and the baselines dashed."""
    series: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for f in report.figures:
        if f.unit == "GB/s":
            series.setdefault((f"{f.path} {f.op}", False), []).append((f.chunk_bytes, f.value))
    for case, c in report.ceilings:
        series.setdefault((f"{c.label} ({case.split('/')[0]})", True), []).append(
            (c.chunk_bytes, c.timing.gbps)
        )
    sizes = sorted({f.chunk_bytes for f in report.figures})
    chart = Chart(
        "tiercache connector: throughput vs chunk size",
        "chunk size",
        "GB/s",
        tuple(Series(label, tuple(points), dashed) for (label, dashed), points in series.items()),
        log_x=True,
        x_ticks=tuple((s, format_size(s)) for s in sizes),
    )
    return [chart]

"""Output of a ``vllm`` run: the TTFT table, the throughput lines, the JSON rows and the charts.

Primitives:
    SCHEMA: the JSON document's schema tag.
    IDEAL_TARGET, MISS_TARGET: the targets (ratio to the ideal where cached; to recompute at 0 %).
    vllm_rows: one JSON-ready row per (length, fraction): medians and tiercache's ratios.
    format_table: the plain-text table of a run.
    format_throughput: the throughput lines.
    save_plot: the charts of a run, as a PNG.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..tables import columns as table_columns
from .columns import Column, VllmBenchConfig
from .run import VllmBenchResult
from .throughput import Throughput

SCHEMA = "tiercache-bench/vllm/1"


IDEAL_TARGET = 1.10


MISS_TARGET = 1.05


_SHOWN = ("recompute", "ideal", "tiercache_l2", "tiercache_l3", "lmcache", "example")


def _by_name(cols: Sequence[Column]) -> dict[str, Column]:
    return {c.name: c for c in cols}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def vllm_rows(config: VllmBenchConfig, cols: Sequence[Column]) -> list[dict[str, Any]]:
    named = _by_name(cols)
    rows = []
    for length in config.lengths:
        for fraction in config.fractions:
            key = (length, fraction)
            ms = {n: named[n].medians.get(key) if n in named else None for n in _SHOWN}
            ours = ms["tiercache_l2"]
            row: dict[str, Any] = {"length": length, "fraction": fraction, "seconds": ms}
            row["cached_tokens"] = {n: c.cached.get(key) for n, c in named.items() if not c.skipped}
            row["vs_ideal"] = _ratio(ours, ms["ideal"])
            row["vs_recompute"] = _ratio(ours, ms["recompute"])
            row["vs_lmcache"] = _ratio(ours, ms["lmcache"])
            row["vs_example"] = _ratio(ours, ms["example"])
            target = row["vs_recompute"] if fraction == 0 else row["vs_ideal"]
            row["target_met"] = (
                None if target is None else target <= (MISS_TARGET if fraction == 0 else IDEAL_TARGET)
            )
            rows.append(row)
    return rows


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.3f}{unit}"


def format_table(config: VllmBenchConfig, cols: Sequence[Column]) -> str:
    """Median TTFT (ms) per column and tiercache's ratios, one line per (length, fraction)."""
    body = []
    for row in vllm_rows(config, cols):
        s = row["seconds"]
        cells = [str(row["length"]), f"{row['fraction']}%"]
        cells += ["-" if s[n] is None else f"{s[n] * 1e3:.1f}" for n in _SHOWN]
        cells += [_fmt(row[k], "x") for k in ("vs_ideal", "vs_recompute", "vs_lmcache", "vs_example")]
        cells.append({None: "-", True: "yes", False: "NO"}[row["target_met"]])
        body.append(cells)
    headers = ["tokens", "cached", *[f"{n} ms" for n in _SHOWN], "vs ideal", "vs recomp", "vs lmcache",
               "vs example", "target"]  # fmt: skip
    lines = table_columns(headers, body, frozenset())
    lines += [f"{c.name}: skipped ({c.skipped})" for c in cols if c.skipped]
    return "\n".join(lines)


def format_throughput(config: VllmBenchConfig, lines: Sequence[Throughput]) -> str:
    """The throughput lines, one per configuration (empty when not measured)."""
    if not lines:
        return ""
    body = [
        [
            t.name,
            str(t.requests),
            f"{t.requests_per_s:.2f}",
            f"{t.mean_ttft_s * 1e3:.1f}",
            str(t.cached_tokens),
            " ".join(f"{r:.2f}" for r in t.runs_per_s),
        ]
        for t in lines
    ]
    runs = max((len(t.runs_per_s) for t in lines), default=1)
    title = (
        f"throughput: {config.throughput_requests} requests over two engines, a shared"
        f" {config.system_tokens}-token system prompt + {config.user_tokens} own tokens each"
        f" (the median of {runs} interleaved runs)"
    )
    headers = ["engines", "requests", "req/s", "mean TTFT ms", "cached tokens", "req/s of each run"]
    return "\n".join([title, *table_columns(headers, body, frozenset())])


def save_plot(config: VllmBenchConfig, result: VllmBenchResult, path: Path) -> None:
    from ..common.plot import Chart, Series, save_chart

    cols = result.columns
    charts = []
    for length in config.lengths:
        series = tuple(
            Series(
                c.name,
                tuple(
                    (float(f), c.medians[(length, f)] * 1e3)
                    for f in config.fractions
                    if (length, f) in c.medians
                ),
            )
            for c in cols
            if not c.skipped
        )
        charts.append(Chart(f"{length}-token prompts", "cached %", "TTFT ms", series))
    if result.throughput:
        series = tuple(Series(t.name, ((t.mean_ttft_s * 1e3, t.requests_per_s),)) for t in result.throughput)
        charts.append(Chart("throughput (two engines)", "mean TTFT ms", "requests/s", series))
    save_chart(charts, path)

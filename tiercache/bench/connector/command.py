"""``tiercache-bench connector``: store/load GB/s through the connector (same-host shared memory and the
byte stream) and lookup latency, each next to its baseline measured in the same run (memcpy, bare gRPC
echo and echo stream on the same socket).

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse

from ..args import (
    add_daemon_flags,
    add_output_flags,
    daemon_config_from_args,
    parse_ints,
    parse_size,
    positive_int,
)
from ..command import FAILURES, failure_status, finish, progress_to_stderr, torch_threads
from ..common.layout_cases import LayoutCase, parse_layouts
from .report import connector_charts, connector_to_dict, format_connector_report
from .run import ConnectorBenchConfig, run_connector


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``connector`` flags to ``p``."""
    p.add_argument(
        "--layouts",
        type=parse_layouts,
        default=parse_layouts("7b,tiny"),
        help="comma-separated KV layouts: 7b (32 layers, 8 kv heads, dim 128), 1b (16x8x64), tiny (4x2x64) "
        "or LAYERSxHEADSxDIM; all bf16 (default 7b,tiny)",
    )
    p.add_argument(
        "--chunk-tokens",
        type=parse_ints,
        default=(256,),
        help="comma-separated tokens per chunk, each a multiple of 16 (256; 7b at 256 = 32 MiB chunks)",
    )
    p.add_argument(
        "--bytes-per-case",
        type=parse_size,
        default=256 << 20,
        help="KV bytes per round and case (256M; capped by the daemon's L2 slots)",
    )
    p.add_argument("--rounds", type=positive_int, default=3, help="timed rounds per path (3, plus a warm-up)")
    p.add_argument("--lookup-calls", type=positive_int, default=300, help="timed Lookup / Echo calls (300)")
    p.add_argument("--no-stream", action="store_true", help="skip the byte-stream path")
    p.add_argument(
        "--threads", type=positive_int, default=None, help="torch intra-op threads (torch's default)"
    )
    p.add_argument("--seed", type=int, default=0, help="KV and prompt seed (0)")
    add_daemon_flags(p, l2_default="1G", l3_default="0")
    add_output_flags(p, "plot GB/s vs chunk size per path and op, baselines dashed (PNG)")


def _config(args: argparse.Namespace) -> ConnectorBenchConfig:
    cases = tuple(
        LayoutCase(name, layers, heads, dim, tokens)
        for name, layers, heads, dim in args.layouts
        for tokens in args.chunk_tokens
    )
    slot = max(c.layout().chunk_bytes for c in cases)
    return ConnectorBenchConfig(
        cases=cases,
        bytes_per_case=args.bytes_per_case,
        rounds=args.rounds,
        lookup_calls=args.lookup_calls,
        stream=not args.no_stream,
        address=args.address,
        token=args.token,
        daemon=daemon_config_from_args(args, slot),
        work_root=args.dir,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``connector``; 0 on success, 1 when a load differed from the store or the daemon failed."""
    try:
        config = _config(args)
    except Exception as exc:  # a layout the core refuses (e.g. chunk tokens not a multiple of 16)
        return failure_status(exc)
    with progress_to_stderr(not args.quiet), torch_threads(args.threads):
        try:
            report = run_connector(config, progress=not args.quiet)
        except FAILURES as exc:  # BenchError is a RuntimeError
            return failure_status(exc)
    return finish(args, connector_to_dict(report), format_connector_report(report), connector_charts(report))

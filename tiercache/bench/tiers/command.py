"""``tiercache-bench tiers``: put/get GB/s and per-call latency of L1, L2, L3 (and, asked for, the shared
tier) against the machine's memcpy and disk ceilings and raw redis-py SET/GET, measured in the same run.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..args import (
    add_output_flags,
    non_negative_int,
    parse_codec,
    parse_device,
    parse_levels,
    parse_size,
    parse_sizes,
    positive_int,
)
from ..command import FAILURES, failure_status, finish, progress_to_stderr, torch_threads
from ..common.tier_ops import TierOptions
from .report import format_report, report_to_dict, tiers_charts
from .run import TiersBenchConfig, run_tiers


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``tiers`` flags to ``p``."""
    p.add_argument("--tiers", type=parse_levels, default=parse_levels("L1,L2,L3"), help="default L1,L2,L3")
    p.add_argument(
        "--chunk-sizes",
        type=parse_sizes,
        default=parse_sizes("256K,1M,4M,16M,32M"),
        help="comma-separated chunk sizes (binary units); default 256K,1M,4M,16M,32M",
    )
    p.add_argument(
        "--bytes-per-size",
        type=parse_size,
        default=256 << 20,
        help="payload bytes moved per chunk size (256M)",
    )
    p.add_argument("--batch", type=positive_int, default=8, help="chunks per put/get call (8)")
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory for L3 and the disk ceiling (a temporary directory is made inside and removed); "
        "default: the user cache dir or the system temp dir",
    )
    p.add_argument(
        "--codec", type=parse_codec, default=parse_codec("raw"), help="L3 codec: raw or zstd (raw)"
    )
    p.add_argument("--zstd-level", type=int, default=3, help="L3 zstd level (3)")
    p.add_argument("--durable", action="store_true", help="L3 fsyncs every commit")
    p.add_argument(
        "--device",
        type=parse_device,
        default="auto",
        help="L1 device: auto (cuda when available), cpu, cuda[:n]",
    )
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed rounds per tier and size (2)")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch intra-op threads for the run (torch's default)",
    )
    p.add_argument("--seed", type=int, default=0, help="payload seed (0)")
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds per chunk size, each a pass of every ceiling then every tier; ratios are the median "
        "of the per-round ratios (3)",
    )
    p.add_argument(
        "--shared-url",
        default="",
        help="with --tiers ...,SHARED: the Redis Cluster / server to measure on (default: a private "
        "three-master cluster started on loopback ports for the run; needs redis-server and redis-cli)",
    )
    p.add_argument(
        "--shared-codec", type=parse_codec, default=parse_codec("raw"), help="SHARED codec: raw or zstd (raw)"
    )
    add_output_flags(p, "plot GB/s vs chunk size per tier and op, ceilings dashed (PNG)")


def _config(args: argparse.Namespace) -> TiersBenchConfig:
    options = TierOptions(
        l1_device=args.device,
        codec=args.codec,
        zstd_level=args.zstd_level,
        durable=args.durable,
        batch=args.batch,
        warmup_rounds=args.warmup,
        shared_url=args.shared_url,
        shared_codec=args.shared_codec,
    )
    return TiersBenchConfig(
        levels=args.tiers,
        chunk_sizes=args.chunk_sizes,
        bytes_per_size=args.bytes_per_size,
        work_root=args.dir,
        options=options,
        seed=args.seed,
        rounds=args.rounds,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``tiers``; 0 on success, 1 when a round trip failed or a tier, the disk or memory failed."""
    config = _config(args)
    with progress_to_stderr(not args.quiet), torch_threads(args.threads):
        try:
            report = run_tiers(config)
        except FAILURES as exc:
            return failure_status(exc)
    doc = report_to_dict(report)
    doc["command"] = "tiers"
    return finish(args, doc, format_report(report), tiers_charts(report))

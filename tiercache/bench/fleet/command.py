"""``tiercache-bench fleet``: effective hit rate and prefill tokens saved for a trace spread over several
hosts' caches, with the shared (Redis Cluster) tier off and on (see :mod:`tiercache.bench.fleet`).

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.redis import RedisToolsMissing

from ..args import add_output_flags, non_negative_int, parse_size, positive_int
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from ..common.workdir import work_directory
from ..workload.traces import TraceKind, TraceSpec
from .report import fleet_to_dict, format_fleet
from .run import FleetConfig, run_fleet


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``fleet`` flags to ``p``."""
    p.add_argument("--hosts", type=positive_int, default=2, help="hosts (daemons' caches) (2)")
    p.add_argument("--requests", type=positive_int, default=200, help="requests in the trace (200)")
    p.add_argument(
        "--trace",
        choices=[k.value for k in TraceKind],
        default=TraceKind.RAG.value,
        help="synthetic trace (rag: a system prompt + Zipf-popular documents + a unique query)",
    )
    p.add_argument("--documents", type=positive_int, default=64, help="rag corpus size (64)")
    p.add_argument("--l2-bytes", type=parse_size, default=64 << 20, help="L2 per host (64M)")
    p.add_argument("--l3-bytes", type=parse_size, default=0, help="L3 per host (0: none)")
    p.add_argument("--chunk-tokens", type=positive_int, default=256, help="tokens per chunk (256)")
    p.add_argument(
        "--shared-url", default="", help="the store for the shared tier (default: a private 3-master cluster)"
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="trace and host-assignment seed (0)")
    p.add_argument("--dir", type=Path, default=None, help="work directory root (L3, the cluster's nodes)")
    add_output_flags(p, "(no chart: the table says it all)")


def run(args: argparse.Namespace) -> int:
    """Run ``fleet``; 0 on success, 1 when a load was not bit-exact or no store could be used."""
    layout = KVLayout(8, 4, 64, KVDtype.BFLOAT16, chunk_tokens=args.chunk_tokens, page_tokens=16)
    spec = replace(TraceSpec(), requests=args.requests, documents=args.documents, seed=args.seed)
    config = FleetConfig(
        hosts=args.hosts,
        layout=layout,
        l2_bytes=args.l2_bytes,
        l3_bytes=args.l3_bytes,
        trace=TraceKind(args.trace),
        spec=spec,
        shared_url=args.shared_url,
        seed=args.seed,
    )
    with progress_to_stderr(not args.quiet), work_directory(args.dir) as work:
        try:
            report = run_fleet(config, work)
        except RedisToolsMissing as exc:
            print(f"tiercache-bench fleet: {exc}")
            return 1
        except FAILURES as exc:
            return failure_status(exc)
    return finish(args, fleet_to_dict(report), format_fleet(report))

"""``singleflight``: N identical requests arriving together on a cold cache, with and without single-flight
prefill coordination, through a real daemon (``--address``, or one started for the run).

The measurement is :mod:`.run`'s, the table :mod:`.report`'s; ``--json`` writes the whole report.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon

from .report import format_single_flight
from .run import SingleFlightBenchConfig, measure_single_flight


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options to ``parser``."""
    d = SingleFlightBenchConfig()
    parser.add_argument("--address", help="daemon address (default: start one for the run)")
    parser.add_argument("--token", help="bearer token of the daemon at --address")
    parser.add_argument("--requests", type=int, default=d.requests, help=f"requests (default {d.requests})")
    parser.add_argument(
        "--chunks", type=int, default=d.chunks, help=f"chunks per prompt (default {d.chunks})"
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=d.chunk_tokens,
        help=f"tokens per chunk (default {d.chunk_tokens})",
    )
    parser.add_argument("--layers", type=int, default=d.layers, help=f"layers (default {d.layers})")
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    parser.add_argument(
        "--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})"
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=d.prefill_tokens_per_s,
        help=f"rate of the synthetic prefill (default {d.prefill_tokens_per_s:g})",
    )
    parser.add_argument(
        "--wait-timeout-s",
        type=float,
        default=d.wait_timeout_s,
        help=f"longest follower wait (default {d.wait_timeout_s:g})",
    )
    parser.add_argument(
        "--independent-compute",
        action="store_true",
        help="give every request its own accelerator (default: their prefill steps run one at a time)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")


def run(args: argparse.Namespace) -> int:
    """Run both modes and print the report; returns the exit status (1 when a request failed)."""
    try:
        config = SingleFlightBenchConfig(
            args.requests,
            args.chunks,
            args.chunk_tokens,
            args.layers,
            args.kv_heads,
            args.head_dim,
            args.prefill_tokens_per_s,
            args.wait_timeout_s,
            not args.independent_compute,
        )
    except ValueError as exc:
        print(f"singleflight: {exc}")
        return 2
    chunk_bytes = config.layout.chunk_bytes
    # Room for every request's stores of both modes, plus the leases of the loads.
    l2 = (2 * config.requests + 2) * config.chunks * chunk_bytes
    daemon_cfg = EmbeddedDaemonConfig(slot_bytes=chunk_bytes, l2_bytes=l2, l3_bytes=0)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tcbench-singleflight-") as work,
            use_daemon(args.address, args.token, daemon_cfg, Path(work)) as daemon,
        ):
            report = measure_single_flight(daemon.address, config, daemon.token)
    except RuntimeError as exc:
        print(f"singleflight: {exc}")
        return 1
    print(format_single_flight(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0

"""``layerwise``: the overlap of layerwise loading with the engine's per-layer compute, as a measured timeline.

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

from .report import format_layerwise
from .run import LayerwiseBenchConfig, measure_layerwise


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options to ``parser``."""
    d = LayerwiseBenchConfig()
    parser.add_argument("--address", help="daemon address (default: start one for the run)")
    parser.add_argument("--token", help="bearer token of the daemon at --address")
    parser.add_argument("--layers", type=int, default=d.layers, help=f"model layers (default {d.layers})")
    parser.add_argument(
        "--chunks", type=int, default=d.chunks, help=f"chunks in the prompt (default {d.chunks})"
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=d.chunk_tokens,
        help=f"tokens per chunk (default {d.chunk_tokens})",
    )
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    parser.add_argument(
        "--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})"
    )
    parser.add_argument("--repeats", type=int, default=d.repeats, help=f"runs per mode (default {d.repeats})")
    parser.add_argument(
        "--threads", type=int, default=d.threads, help=f"torch threads of the compute (default {d.threads})"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the measurement and print the report; returns the exit status (1 when the daemon failed)."""
    try:
        config = LayerwiseBenchConfig(
            args.layers,
            args.chunks,
            args.chunk_tokens,
            args.kv_heads,
            args.head_dim,
            args.repeats,
            args.threads,
        )
    except ValueError as exc:
        print(f"layerwise: {exc}")
        return 2
    chunk_bytes = config.layout.chunk_bytes
    daemon_cfg = EmbeddedDaemonConfig(
        slot_bytes=chunk_bytes, l2_bytes=2 * config.chunks * chunk_bytes + chunk_bytes, l3_bytes=0
    )
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tcbench-layerwise-") as work,
            use_daemon(args.address, args.token, daemon_cfg, Path(work)) as daemon,
        ):
            report = measure_layerwise(daemon.address, config, daemon.token)
    except RuntimeError as exc:
        print(f"layerwise: {exc}")
        return 1
    print(format_layerwise(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0

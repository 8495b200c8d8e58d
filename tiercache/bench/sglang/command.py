"""``sglang``: SGLang HiCache's zero-copy ``batch_set_v1`` / ``batch_get_v1`` through ``TierCacheStorage``
against memcpy of the same bytes, on SGLang's real host KV pools (needs the ``sglang`` extra).

The measurement is :mod:`.run`'s, the table and JSON :mod:`.report`'s.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status (1 when a load lost or changed bytes).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

from tiercache.connector.config import DataPlaneMode
from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon
from tiercache.testing.sglang import MISSING

from ..command import FAILURES, failure_status
from ..common.documents import write_document
from .run import L2_BATCHES, LAYOUTS, SglangBenchConfig


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options to ``parser``."""
    d = SglangBenchConfig()
    parser.add_argument("--address", help="daemon address (default: start one for the run)")
    parser.add_argument("--token", help="bearer token of the daemon at --address")
    parser.add_argument(
        "--layout", choices=LAYOUTS, default=d.layout, help=f"host pool layout (default {d.layout})"
    )
    parser.add_argument("--pages", type=int, default=d.pages, help=f"pages per call (default {d.pages})")
    parser.add_argument(
        "--page-tokens", type=int, default=d.page_tokens, help=f"tokens per page (default {d.page_tokens})"
    )
    parser.add_argument("--layers", type=int, default=d.layers, help=f"model layers (default {d.layers})")
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    parser.add_argument("--head-dim", type=int, default=d.head_dim, help=f"head size (default {d.head_dim})")
    parser.add_argument("--rounds", type=int, default=d.rounds, help=f"timed rounds (default {d.rounds})")
    parser.add_argument(
        "--data-plane",
        choices=[m.value for m in DataPlaneMode],
        default=d.data_plane.value,
        help="the backend's data plane (default auto: shared memory on this host)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the measurement and print the table; the exit status."""
    if importlib.util.find_spec("sglang") is None:
        print(f"sglang: {MISSING}")
        return 1
    from .report import format_sglang, sglang_document
    from .run import measure_sglang

    try:
        config = SglangBenchConfig(
            args.layout, args.pages, args.page_tokens, args.layers, args.kv_heads, args.head_dim, args.rounds,
            DataPlaneMode(args.data_plane),
        )  # fmt: skip
    except ValueError as exc:
        print(f"sglang: {exc}")
        return 2
    batch = config.pages * config.page_bytes
    daemon_cfg = EmbeddedDaemonConfig(slot_bytes=config.page_bytes, l2_bytes=L2_BATCHES * batch, l3_bytes=0)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tcbench-sglang-") as work,
            use_daemon(args.address, args.token, daemon_cfg, Path(work)) as daemon,
        ):
            report = measure_sglang(daemon.address, daemon.token, config)
    except FAILURES as exc:
        return failure_status(exc)
    print(format_sglang(report))
    if args.json is not None:
        write_document(sglang_document(report), args.json)
    return 0 if report.verified else 1

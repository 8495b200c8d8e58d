"""``tiercache-bench concurrency``: aggregate put+get GB/s of an in-process cache manager under T threads,
next to a memcpy ceiling measured in the same run; every round trip is verified byte for byte.

The measurement is :mod:`.run`'s, the table :mod:`.report`'s.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from tiercache.tiers.base import TierLevel

from ..args import parse_device, parse_ints, parse_levels, parse_size, parse_sizes
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from .report import format_table
from .run import ConcurrencyConfig, run_concurrency


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``concurrency`` flags to ``p``."""
    p.add_argument("--threads", type=parse_ints, default=(1, 2, 4), help="thread counts (1,2,4)")
    p.add_argument(
        "--chunk-sizes", type=parse_sizes, default=parse_sizes("1M,4M"), help="chunk sizes (1M,4M)"
    )
    p.add_argument(
        "--bytes-per-thread", type=parse_size, default=64 << 20, help="bytes each thread stores (64M)"
    )
    p.add_argument(
        "--tiers", type=parse_levels, default=parse_levels("L2"), help="manager tiers; L2 always (L2)"
    )
    p.add_argument("--device", type=parse_device, default="cpu", help="L1 device when L1 is on (cpu)")
    p.add_argument("--dir", type=Path, default=None, help="parent of the temporary L3 directory")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    """Run ``concurrency``; 0 on success, 1 when a round trip failed or a tier failed."""
    threads: Sequence[int] = args.threads
    if any(t <= 0 for t in threads):
        print("tiercache-bench: --threads: must be positive", flush=True)
        return 2
    levels = tuple(sorted({*args.tiers, TierLevel.L2}))
    config = ConcurrencyConfig(
        tuple(threads), args.chunk_sizes, args.bytes_per_thread, levels, args.device, args.dir
    )
    with progress_to_stderr(not args.quiet):
        try:
            doc = run_concurrency(config)
        except FAILURES as exc:
            return failure_status(exc)
    return finish(args, doc, format_table(doc))

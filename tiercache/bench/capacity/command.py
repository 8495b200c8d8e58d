"""``tiercache-bench capacity``: the share of an L2 tier's configured bytes that mixes of chunk sizes use,
under small pages and under one page per slot (see :mod:`.run`).

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
import time

from ..args import add_output_flags, non_negative_int, parse_size
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from .report import capacity_charts, capacity_to_dict, format_capacity_report
from .run import DEFAULT_MIXES, CapacityConfig, run_capacity


def _pages(text: str) -> tuple[int, ...]:
    """Comma-separated page sizes; ``0`` is one page per slot."""
    return tuple(0 if part.strip() == "0" else parse_size(part.strip()) for part in text.split(","))


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``capacity`` flags to ``p``."""
    p.add_argument("--capacity", type=parse_size, default=512 << 20, help="the L2 tier's bytes (512M)")
    p.add_argument("--slot-bytes", type=parse_size, default=32 << 20, help="the largest chunk (32M)")
    p.add_argument("--page-sizes", type=_pages, default=(64 << 10, 0),
                   help="page sizes to compare, 0 = one page per slot (64K,0)")  # fmt: skip
    p.add_argument(
        "--churn",
        type=non_negative_int,
        default=1000,
        help="chunks stored after the tier is first full (1000)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the chunk sizes (0)")
    add_output_flags(p, "plot utilisation per mix and page size (PNG)")


def run(args: argparse.Namespace) -> int:
    """Run ``capacity``; 0 on success (targets missed included), 1 when the run failed."""
    try:
        config = CapacityConfig(
            capacity_bytes=args.capacity,
            slot_bytes=args.slot_bytes,
            page_sizes=args.page_sizes,
            mixes=tuple(m for m in DEFAULT_MIXES if m.high <= args.slot_bytes),
            churn_chunks=args.churn,
            seed=args.seed,
        )
    except ValueError as exc:
        return failure_status(exc)
    start = time.perf_counter()
    with progress_to_stderr(not args.quiet):
        try:
            rows = run_capacity(config)
        except FAILURES as exc:
            return failure_status(exc)
    elapsed = time.perf_counter() - start
    return finish(
        args,
        capacity_to_dict(config, rows, elapsed),
        format_capacity_report(config, rows, elapsed),
        capacity_charts(config, rows),
    )

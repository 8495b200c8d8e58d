"""``tiercache-bench scale``: lookup latency, index memory, eviction cost and warm restart from a thousand
indexed chunks to a million, each as a ratio to the smallest count.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiercache.errors import InvalidArgumentError
from tiercache.policies.registry import parse_kind

from ..args import add_output_flags, positive_int
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from .report import format_scale_report, scale_charts, scale_to_dict
from .run import DEFAULT_COUNTS, ScaleConfig, ScaleFill, run_scale


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(float(part)) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--counts: not a list of numbers: {text!r}") from exc
    if not counts or min(counts) <= 0:
        raise argparse.ArgumentTypeError(f"--counts: positive chunk counts, comma-separated: {text!r}")
    return counts


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``scale`` flags to ``p``."""
    p.add_argument("--counts", type=_counts, default=DEFAULT_COUNTS,
                   help="chunk counts, ascending (1e3,1e4,1e5,1e6)")  # fmt: skip
    p.add_argument("--prompt-chunks", type=positive_int, default=64, help="chunks per prompt and lookup (64)")
    p.add_argument("--lookups", type=positive_int, default=200, help="timed lookups per count (200)")
    p.add_argument("--evictions", type=positive_int, default=20, help="timed evicting stores per count (20)")
    p.add_argument("--no-restart", action="store_true", help="skip the warm restart")
    p.add_argument("--dir", type=Path, default=None, help="directory for the work dir (L3)")
    p.add_argument("--fill", choices=[k.value for k in ScaleFill], default=ScaleFill.CACHE.value,
                   help="cache: through the cache (L2 + L3); bulk: L3 written in bulk, the warm start on it "
                   "measured (the way to 1e6 chunks)")  # fmt: skip
    add_output_flags(p, "plot lookup and eviction cost vs chunks (PNG)")


def run(args: argparse.Namespace) -> int:
    """Run ``scale``; 0 on success, 1 when a tier or the system refused."""
    try:
        config = ScaleConfig(
            counts=args.counts,
            prompt_chunks=args.prompt_chunks,
            lookups=args.lookups,
            evictions=args.evictions,
            restart=not args.no_restart,
            work_root=args.dir,
            fill=parse_kind(ScaleFill, args.fill, "fill"),
        )
    except (ValueError, InvalidArgumentError) as exc:
        return failure_status(exc)
    with progress_to_stderr(not args.quiet):
        try:
            report = run_scale(config, progress=not args.quiet)
        except FAILURES as exc:
            return failure_status(exc)
    return finish(args, scale_to_dict(report), format_scale_report(report), scale_charts(report))

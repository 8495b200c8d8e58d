"""``tiercache-bench soak``: many engine processes storing and loading mixed prompts against one daemon
(the real connector, every load checked bit for bit), with the daemon's RSS, open fds, threads and
shared-memory segments measured between two phases, all engines connected.

Primitives:
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

import torch

from .args import add_output_flags, positive_float, positive_int
from .ceilings import describe_machine
from .command import FAILURES, failure_status, finish, progress_to_stderr
from .faults_report import all_ok, format_rows, soak_rows, soak_to_dict
from .soak import SoakConfig, run_soak


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``soak`` flags to ``p``."""
    p.add_argument("--engines", type=positive_int, default=32, help="engine processes (32)")
    p.add_argument(
        "--duration-s", type=positive_float, default=600.0, help="soak length, two phases of half (600)"
    )
    p.add_argument(
        "--prompts", type=positive_int, default=256, help="distinct prompts the engines share (256)"
    )
    p.add_argument("--dir", type=Path, default=None, help="parent of the run's work directory (a temp dir)")
    add_output_flags(p, "(no plot for this command)")


def run(args: argparse.Namespace) -> int:
    """Run ``soak``; 0 when every figure is what it must be, 1 otherwise or on failure."""
    root = Path(tempfile.mkdtemp(prefix="tiercache-soak-", dir=args.dir))
    config = SoakConfig(work_dir=root, engines=args.engines, duration_s=args.duration_s, prompts=args.prompts)
    with progress_to_stderr(not args.quiet):
        try:
            report = run_soak(config)
        except FAILURES as exc:
            return failure_status(exc)
    machine = dataclasses.asdict(describe_machine(torch.device("cpu"), root))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)  # L3s and logs of a temporary run
    rows = soak_rows(report)
    status = finish(args, soak_to_dict(report, machine), format_rows(rows))
    return status or (0 if all_ok(rows) else 1)

"""``tiercache-bench faults``: kill -9 of the daemon mid-stores on one L3, corrupted L3 values, engines
killed while holding leases / tickets / claims / layerwise saves, and garbage on every RPC — as figures.

Every part starts its own daemon processes (small sizes, short lifetimes) in a work directory. The table
prints each figure next to what it must be; the exit status is 1 when one is not. A full disk is covered by
``tests/faults/test_full_disk.py`` (it needs root to mount a small filesystem).

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

from .args import add_output_flags, non_negative_int, positive_int
from .ceilings import describe_machine
from .command import FAILURES, failure_status, finish, progress_to_stderr
from .faults_corrupt import CorruptConfig, run_corruption
from .faults_daemon import KillableDaemon
from .faults_engines import EngineKillConfig, run_engine_kills
from .faults_garbage import GarbageReport, run_garbage
from .faults_kill import KillConfig, default_daemon, run_kills
from .faults_report import FaultsReport, all_ok, faults_rows, faults_to_dict, format_rows

PARTS = ("kill", "corrupt", "engines", "garbage")


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the ``faults`` flags to ``p``."""
    p.add_argument("--kills", type=positive_int, default=20, help="daemon SIGKILLs on one L3 (20)")
    p.add_argument("--injections", type=positive_int, default=12, help="corrupted L3 values (12, <= 16)")
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run: {', '.join(PARTS)} (all)",
    )
    p.add_argument("--seed", type=non_negative_int, default=0, help="where the corruption goes (0)")
    p.add_argument("--dir", type=Path, default=None, help="parent of the run's work directory (a temp dir)")
    add_output_flags(p, "(no plot for this command)")


def _garbage(work: Path) -> GarbageReport:
    short = Path(tempfile.mkdtemp(prefix="tcgarb-"))  # a short path: unix socket paths are limited
    daemon = KillableDaemon(default_daemon(), work, work / "l3", short / "d.sock")
    try:
        daemon.start()
        report = run_garbage(daemon.address)
        if not daemon.alive():
            raise RuntimeError("the daemon died under garbage RPCs")
        return report
    finally:
        daemon.stop()
        shutil.rmtree(short, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    """Run ``faults``; 0 when every figure is what it must be, 1 otherwise or on failure."""
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        return failure_status(ValueError(f"--parts: unknown {sorted(unknown)}; valid: {', '.join(PARTS)}"))
    root = Path(tempfile.mkdtemp(prefix="tiercache-faults-", dir=args.dir))

    def work(part: str) -> Path | None:
        if part not in parts:
            return None
        (root / part).mkdir()
        return root / part

    with progress_to_stderr(not args.quiet):
        try:
            kill = corrupt = engines = garbage = None
            if (w := work("kill")) is not None:
                kill = run_kills(KillConfig(work_dir=w, kills=args.kills))
            if (w := work("corrupt")) is not None:
                injections = min(args.injections, 16)
                corrupt = run_corruption(CorruptConfig(work_dir=w, injections=injections, seed=args.seed))
            if (w := work("engines")) is not None:
                engines = run_engine_kills(EngineKillConfig(work_dir=w))
            if (w := work("garbage")) is not None:
                garbage = _garbage(w)
        except FAILURES as exc:
            return failure_status(exc)  # the work directory stays, with the daemons' logs
    report = FaultsReport(kill, corrupt, engines, garbage)
    machine = dataclasses.asdict(describe_machine(torch.device("cpu"), root))
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)  # L3s and logs of a temporary run
    rows = faults_rows(report)
    status = finish(args, faults_to_dict(report, machine), format_rows(rows))
    return status or (0 if all_ok(rows) else 1)

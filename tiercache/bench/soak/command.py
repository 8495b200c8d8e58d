"""``tiercache-bench soak``: many engine processes storing and loading mixed prompts against one daemon
(the real connector, every load checked bit for bit), with the daemon's RSS, open fds, threads and
shared-memory segments measured between two phases, all engines connected.

The work is :func:`tiercache.testing.soak.run_soak` (which ``tests/faults`` runs too); this module is the
command and its report.

Primitives:
    SOAK_SCHEMA: the JSON document's schema.
    soak_rows / soak_to_dict: the table rows and the JSON document.
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tiercache.testing.soak import RSS_SLACK_BYTES, THREAD_SLACK, SoakConfig, SoakReport, run_soak

from ..args import add_output_flags, positive_float, positive_int
from ..ceilings import describe_machine
from ..command import FAILURES, failure_status, finish
from ..faults.command import Row, all_ok, format_rows, must_be_zero, progress
from ..tables import format_size

SOAK_SCHEMA = "tiercache-bench/soak/1"


def soak_rows(s: SoakReport) -> list[Row]:
    """The table rows of a soak."""
    d_rss = s.end.rss_bytes - s.start.rss_bytes
    return [
        ("engine processes", str(s.engines), "-", True),
        ("soak duration s (two phases)", f"{s.duration_s:.0f}", "-", True),
        ("requests (stores / loads)", f"{s.requests} ({s.stores} / {s.loads})", "-", True),
        must_be_zero("errors", s.errors),
        must_be_zero("loads with a wrong byte", s.wrong_loads),
        ("daemon RSS start -> end", f"{format_size(s.start.rss_bytes)} -> {format_size(s.end.rss_bytes)}",
         f"+<= {format_size(RSS_SLACK_BYTES)}", d_rss <= RSS_SLACK_BYTES),
        ("daemon open fds start -> end (-> engines gone)", f"{s.start.fds} -> {s.end.fds} ({s.after.fds})",
         "equal", s.end.fds == s.start.fds),
        ("daemon threads start -> end", f"{s.start.threads} -> {s.end.threads}", f"+<= {THREAD_SLACK}",
         s.end.threads <= s.start.threads + THREAD_SLACK),
        ("shared-memory segments start -> end", f"{s.start.segments} -> {s.end.segments}", "equal",
         s.end.segments == s.start.segments),
    ]  # fmt: skip


def soak_to_dict(s: SoakReport, machine: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a soak."""
    return {"schema": SOAK_SCHEMA, "machine": machine, "soak": asdict(s), "ok": all_ok(soak_rows(s))}


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
    with progress(not args.quiet):
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

"""``tiercache-bench faults``: kill -9 of the daemon mid-stores on one L3, corrupted L3 values, engines
killed while holding leases / tickets / claims / layerwise saves, and garbage on every RPC — as figures.

The work is the fault machinery of :mod:`tiercache.testing.faults` (which ``tests/faults`` runs too); this
module is the command and its report. Every part starts its own daemon processes (small sizes, short
lifetimes) in a work directory. The table prints each figure next to what it must be (``0``, ``= injected``,
``<= bound``); the exit status is 1 when one is not. A full disk is covered by
``tests/faults/test_full_disk.py`` (it needs root to mount a small filesystem).

Primitives:
    FAULTS_SCHEMA: the JSON document's schema.
    FaultsReport: the parts of a faults run (each None when skipped).
    Row / must_be_zero / faults_rows / format_rows / all_ok: the (figure, value, must be, ok) table.
    faults_to_dict: the JSON document.
    progress: the run's progress lines (the bench's and the fault machinery's) on stderr.
    configure_parser: the subcommand's flags.
    run: run it from parsed arguments; the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tiercache.testing.embedded import daemon_process
from tiercache.testing.faults.corrupt import CorruptConfig, CorruptReport, run_corruption
from tiercache.testing.faults.engines import EngineKillConfig, EngineKillReport, run_engine_kills
from tiercache.testing.faults.garbage import GarbageReport, run_garbage
from tiercache.testing.faults.kill import KillConfig, KillReport, default_daemon, run_kills

from ..args import add_output_flags, non_negative_int, positive_int
from ..ceilings import describe_machine
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from ..tables import columns

PARTS = ("kill", "corrupt", "engines", "garbage")
FAULTS_SCHEMA = "tiercache-bench/faults/1"

Row = tuple[str, str, str, bool]
"""(figure, value, what it must be, whether it is)."""


@dataclass(frozen=True, slots=True)
class FaultsReport:
    """A faults run.

    Attributes:
        kill: the kill -9 rounds.
        corrupt: the corrupted L3 values.
        engines: the engines killed while holding things.
        garbage: the malformed RPCs.
    """

    kill: KillReport | None
    corrupt: CorruptReport | None
    engines: EngineKillReport | None
    garbage: GarbageReport | None


def must_be_zero(name: str, value: int) -> Row:
    return (name, str(value), "0", value == 0)


def faults_rows(r: FaultsReport) -> list[Row]:
    """The table rows of a faults run."""
    rows: list[Row] = []
    if r.kill is not None:
        k = r.kill
        rows += [
            ("daemon kills (SIGKILL mid-stores, one L3)", str(k.kills), "-", True),
            (
                "prompts / chunks acknowledged",
                f"{k.prompts_acknowledged} / {k.chunks_acknowledged}",
                "-",
                True,
            ),
            ("loads checked after restarts", str(k.loads_checked), "-", True),
            must_be_zero("torn or wrong chunks served", k.torn_served),
            must_be_zero(f"L3 chunks lost (of {k.l3_chunks_checked} checked)", k.l3_chunks_lost),
            must_be_zero("L3 environments moved aside", k.moved_aside),
            (
                "acknowledged chunks lost: write-down backlog, worst kill",
                str(k.backlog_lost_max),
                f"<= {k.backlog_bound} (L1+L2 slots)",
                k.backlog_lost_max <= k.backlog_bound,
            ),
            ("acknowledged chunks lost: all kills", str(k.backlog_lost_total), "-", True),
        ]
    if r.corrupt is not None:
        c = r.corrupt
        kinds = ", ".join(f"{n} {kind}" for kind, n in c.by_kind.items())
        rows += [
            (f"corrupt values detected / injected ({kinds})", f"{c.detected} / {c.injected}", "all",
             c.detected == c.injected),
            must_be_zero("damaged chunks served", c.served_damaged),
            must_be_zero("loads with a wrong byte", c.wrong_loads),
        ]  # fmt: skip
    if r.engines is not None:
        e = r.engines
        held = ", ".join(f"{kind} {n}" for kind, n in e.held.items())
        rows += [
            (f"engines SIGKILLed holding chunks ({held})", str(e.engines_killed), "-", True),
            ("their holds drained", "yes" if e.drained else "NO", "yes", e.drained),
            ("drain time s (lifetimes bound it)", f"{e.drain_s:.1f}", f"~{e.bound_s:.1f}", True),
            must_be_zero("half-written chunks visible", e.half_written_visible),
            ("unfinished prompts stored again, exact", "yes" if e.restored_exact else "NO", "yes",
             e.restored_exact),
        ]  # fmt: skip
    if r.garbage is not None:
        g = r.garbage
        rows += [
            (f"malformed RPCs / INVALID_ARGUMENT ({g.methods} methods)", f"{g.sent} / {g.invalid_argument}",
             "all", g.invalid_argument == g.sent),
            must_be_zero("other answers", sum(g.other.values())),
        ]  # fmt: skip
    return rows


def format_rows(rows: Sequence[Row]) -> str:
    """The aligned table."""
    cells = [[name, value, must, "yes" if ok else "NO"] for name, value, must, ok in rows]
    return "\n".join(columns(["figure", "value", "must be", "ok"], cells, frozenset({0, 2})))


def all_ok(rows: Sequence[Row]) -> bool:
    """Whether every figure is what it must be."""
    return all(ok for *_, ok in rows)


def faults_to_dict(r: FaultsReport, machine: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a faults run."""
    parts = {name: (None if part is None else asdict(part)) for name, part in _parts(r).items()}
    return {"schema": FAULTS_SCHEMA, "machine": machine, **parts, "ok": all_ok(faults_rows(r))}


def _parts(r: FaultsReport) -> dict[str, Any]:
    """The parts of a faults report by name (not converted)."""
    return {"kill": r.kill, "corrupt": r.corrupt, "engines": r.engines, "garbage": r.garbage}


@contextlib.contextmanager
def progress(enabled: bool) -> Iterator[None]:
    """:func:`~.command.progress_to_stderr`, with the INFO lines of :mod:`tiercache.testing` too."""
    with progress_to_stderr(enabled):
        if not enabled:
            yield
            return
        machinery = logging.getLogger("tiercache.testing")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tiercache-bench: %(message)s"))
        old_level = machinery.level
        machinery.addHandler(handler)
        machinery.setLevel(logging.INFO)
        try:
            yield
        finally:
            machinery.removeHandler(handler)
            machinery.setLevel(old_level)


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
    daemon = daemon_process(default_daemon(), work, work / "l3", short / "d.sock", "faults")
    try:
        daemon.start()
        report = run_garbage(daemon.address)
        if not daemon.alive():
            raise RuntimeError("the daemon died under garbage RPCs")
        return report
    finally:
        daemon.cleanup()
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

    with progress(not args.quiet):
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

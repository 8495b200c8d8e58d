"""Output of ``tiercache-bench faults`` and ``tiercache-bench soak``: a table for people, JSON for tools.

Each figure is printed next to what it must be (``0``, ``= injected``, ``<= bound``) and whether it is;
a figure that is not what it must be makes the run fail (exit status 1).

Primitives:
    FaultsReport: the parts of a faults run (each None when skipped).
    faults_rows / soak_rows: (figure, value, must be, ok) rows.
    format_rows: the aligned table.
    faults_to_dict / soak_to_dict: JSON-ready documents.
    all_ok: whether every row holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .faults_corrupt import CorruptReport
from .faults_engines import EngineKillReport
from .faults_garbage import GarbageReport
from .faults_kill import KillReport
from .soak import SoakReport
from .tables import columns, format_size

FAULTS_SCHEMA = "tiercache-bench/faults/1"
SOAK_SCHEMA = "tiercache-bench/soak/1"

RSS_SLACK_BYTES = 32 << 20
"""Daemon RSS growth a soak may show between its phases (allocator noise; a per-request leak is far more)."""
THREAD_SLACK = 8
"""Daemon threads that may appear between the phases (executor pools grow on demand up to their bound)."""

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


def _zero(name: str, value: int) -> Row:
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
            _zero("torn or wrong chunks served", k.torn_served),
            _zero(f"L3 chunks lost (of {k.l3_chunks_checked} checked)", k.l3_chunks_lost),
            _zero("L3 environments moved aside", k.moved_aside),
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
            _zero("damaged chunks served", c.served_damaged),
            _zero("loads with a wrong byte", c.wrong_loads),
        ]  # fmt: skip
    if r.engines is not None:
        e = r.engines
        held = ", ".join(f"{kind} {n}" for kind, n in e.held.items())
        rows += [
            (f"engines SIGKILLed holding chunks ({held})", str(e.engines_killed), "-", True),
            ("their holds drained", "yes" if e.drained else "NO", "yes", e.drained),
            ("drain time s (lifetimes bound it)", f"{e.drain_s:.1f}", f"~{e.bound_s:.1f}", True),
            _zero("half-written chunks visible", e.half_written_visible),
            ("unfinished prompts stored again, exact", "yes" if e.restored_exact else "NO", "yes",
             e.restored_exact),
        ]  # fmt: skip
    if r.garbage is not None:
        g = r.garbage
        rows += [
            (f"malformed RPCs / INVALID_ARGUMENT ({g.methods} methods)", f"{g.sent} / {g.invalid_argument}",
             "all", g.invalid_argument == g.sent),
            _zero("other answers", sum(g.other.values())),
        ]  # fmt: skip
    return rows


def soak_rows(s: SoakReport) -> list[Row]:
    """The table rows of a soak."""
    d_rss = s.end.rss_bytes - s.start.rss_bytes
    return [
        ("engine processes", str(s.engines), "-", True),
        ("soak duration s (two phases)", f"{s.duration_s:.0f}", "-", True),
        ("requests (stores / loads)", f"{s.requests} ({s.stores} / {s.loads})", "-", True),
        _zero("errors", s.errors),
        _zero("loads with a wrong byte", s.wrong_loads),
        ("daemon RSS start -> end", f"{format_size(s.start.rss_bytes)} -> {format_size(s.end.rss_bytes)}",
         f"+<= {format_size(RSS_SLACK_BYTES)}", d_rss <= RSS_SLACK_BYTES),
        ("daemon open fds start -> end (-> engines gone)", f"{s.start.fds} -> {s.end.fds} ({s.after.fds})",
         "equal", s.end.fds == s.start.fds),
        ("daemon threads start -> end", f"{s.start.threads} -> {s.end.threads}", f"+<= {THREAD_SLACK}",
         s.end.threads <= s.start.threads + THREAD_SLACK),
        ("shared-memory segments start -> end", f"{s.start.segments} -> {s.end.segments}", "equal",
         s.end.segments == s.start.segments),
    ]  # fmt: skip


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


def soak_to_dict(s: SoakReport, machine: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a soak."""
    return {"schema": SOAK_SCHEMA, "machine": machine, "soak": asdict(s), "ok": all_ok(soak_rows(s))}


def _parts(r: FaultsReport) -> dict[str, Any]:
    """The parts of a faults report by name (not converted)."""
    return {"kill": r.kill, "corrupt": r.corrupt, "engines": r.engines, "garbage": r.garbage}

"""A soak: many engine processes storing and loading mixed prompts against one daemon, with the daemon's
footprint measured before and after.

Every engine (:mod:`tiercache.testing.faults.engine`, mode ``soak``) connects through the real connector and
warms up. The soak runs in two phases of half the duration each: the first brings the daemon to its
working state (thread pools grown, caches filled), then the run measures the daemon (RSS, open file
descriptors, threads, shared-memory segments) with every engine connected (``start``); the second runs,
and the run measures again, the engines still connected (``end``); then they exit and it measures once
more (``after``). Flat means ``end`` equals ``start`` within a tolerance of counts and bytes, never of
time. Each engine checks every load bit for bit and counts errors; the run sums both phases.

Primitives:
    RSS_SLACK_BYTES / THREAD_SLACK: how much a flat daemon may still grow between the phases.
    SoakConfig: engines, duration, prompts, the daemon and the work directory.
    SoakReport: requests, errors, wrong loads and the footprints (start, end, after the engines left).
    run_soak: run it; the report.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from .daemon import ProcessFootprint
from .embedded import EmbeddedDaemonConfig, daemon_process
from .engine import EngineProcess
from .faults.engines import engine_process
from .faults.kill import default_daemon
from .faults.workload import LAYOUT

logger = logging.getLogger(__name__)

RSS_SLACK_BYTES = 32 << 20
"""Daemon RSS growth a soak may show between its phases (allocator noise; a per-request leak is far more)."""
THREAD_SLACK = 8
"""Daemon threads that may appear between the phases (executor pools grow on demand up to their bound)."""


def _soak_daemon() -> EmbeddedDaemonConfig:
    return replace(default_daemon(), l2_bytes=512 * LAYOUT.chunk_bytes)


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """What a soak does.

    Attributes:
        work_dir: an existing directory the run owns.
        engines: engine processes.
        duration_s: how long each engine stores and loads once all are connected (two phases of half).
        prompts: distinct prompts the engines share (more chunks than L2 holds, so L3 serves too).
        chunks: chunks per prompt.
        daemon: the daemon.
    """

    work_dir: Path
    engines: int = 32
    duration_s: float = 60.0
    prompts: int = 256
    chunks: int = 4
    daemon: EmbeddedDaemonConfig = field(default_factory=_soak_daemon)


@dataclass(frozen=True, slots=True)
class SoakReport:
    """Figures of a soak.

    Attributes:
        engines: engine processes.
        duration_s: the soak's length per engine.
        requests / stores / loads: issued by all engines.
        errors: failed calls (must be 0).
        wrong_loads: loads with a wrong byte (must be 0).
        tokens_loaded: tokens loaded in all.
        start / end: the daemon's footprint with every engine connected, after the first and the second
            phase.
        after: its footprint once the engines exited.
    """

    engines: int
    duration_s: float
    requests: int
    stores: int
    loads: int
    errors: int
    wrong_loads: int
    tokens_loaded: int
    start: ProcessFootprint
    end: ProcessFootprint
    after: ProcessFootprint


def run_soak(config: SoakConfig) -> SoakReport:
    """Start the daemon and the engines, soak, measure; the figures."""
    sock_dir = Path(tempfile.mkdtemp(prefix="tcsoak-"))
    daemon = daemon_process(
        config.daemon, config.work_dir, config.work_dir / "l3", sock_dir / "d.sock", "faults"
    )
    daemon.start()
    engines: list[EngineProcess] = []
    try:
        base = {"mode": "soak", "address": daemon.address, "duration_s": config.duration_s / 2}
        base |= {"prompts": config.prompts, "chunks": config.chunks}
        engines = [engine_process({**base, "engine": i}, config.work_dir) for i in range(config.engines)]
        for e in engines:
            e.message()  # connected and warmed up
        summaries = []
        footprints = []
        for _ in range(2):
            for e in engines:
                e.tell("go")
            summaries += [e.message(config.duration_s + 120.0) for e in engines]
            footprints.append(daemon.footprint())
        start, end = footprints
        for e in engines:
            e.tell("exit")
        for e in engines:
            e.wait()
        after = daemon.footprint()
        logger.info("soak: daemon after phase 1 %s, after phase 2 %s, engines gone %s", start, end, after)
    finally:
        for e in engines:
            e.close()
        daemon.cleanup()
        shutil.rmtree(sock_dir, ignore_errors=True)

    def total(name: str) -> int:
        return sum(int(s[name]) for s in summaries)

    return SoakReport(
        engines=config.engines,
        duration_s=config.duration_s,
        requests=total("requests"),
        stores=total("stores"),
        loads=total("loads"),
        errors=total("errors"),
        wrong_loads=total("wrong_loads"),
        tokens_loaded=total("tokens_loaded"),
        start=start,
        end=end,
        after=after,
    )

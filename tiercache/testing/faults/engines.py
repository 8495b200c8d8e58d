"""Engines SIGKILLed while holding a load lease, a store ticket (half written), a prefill claim and a
layerwise save (one layer saved): everything they held drains within its lifetime, nothing half-written
becomes visible.

The daemon runs with short lifetimes. Engine processes (:mod:`tiercache.testing.faults.engine`) each take one
kind of hold, say so, and are killed with SIGKILL. The run then waits (bounded by the lifetimes) until
the daemon shows no lease and no claim and has reclaimed the tickets at their TTL, checks that the prompts
of the ticket and of the save are not visible (Lookup finds none of their chunks), and that they can be
stored and loaded again, bit for bit (the dead engines' reservations no longer block them).

Primitives:
    engine_process: one engine process of :mod:`.engine` (see :class:`~tiercache.testing.engine.EngineProcess`).
    EngineKillConfig: the lifetimes, the daemon and the work directory.
    EngineKillReport: the figures.
    run_engine_kills: run it; the report.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tiercache.keys import chunk_keys

from ..embedded import EmbeddedDaemonConfig, daemon_process
from ..engine import EngineProcess
from .kill import default_daemon
from .workload import LAYOUT, connect, load_and_check, prompt_tokens, store_prompt

logger = logging.getLogger(__name__)

HOLDS = ("hold", "ticket", "claim", "save")
"""What the killed engines hold: a load lease, a store ticket, a prefill claim, a layerwise save."""


def engine_process(params: dict[str, Any], log_dir: Path) -> EngineProcess:
    """Start one engine process of :mod:`.engine` (its stderr in ``log_dir``)."""
    argv = [sys.executable, "-m", "tiercache.testing.faults.engine"]
    return EngineProcess(
        argv, params, stderr_path=log_dir / f"engine-{params['mode']}-{secrets.token_hex(3)}.log"
    )


def _short_lived() -> EmbeddedDaemonConfig:
    return replace(default_daemon(), lease_ttl_s=2.0, max_ttl_s=10.0)


@dataclass(frozen=True, slots=True)
class EngineKillConfig:
    """What an engine-kill run does.

    Attributes:
        work_dir: an existing directory the run owns.
        claim_ttl_s: the killed leader's claim lifetime.
        chunks: chunks per prompt.
        daemon: the daemon (its ``lease_ttl_s`` is the lifetime of leases, tickets and saves).
    """

    work_dir: Path
    claim_ttl_s: float = 2.0
    chunks: int = 4
    daemon: EmbeddedDaemonConfig = field(default_factory=_short_lived)


@dataclass(frozen=True, slots=True)
class EngineKillReport:
    """Figures of an engine-kill run.

    Attributes:
        engines_killed: engine processes SIGKILLed while holding something.
        held: per kind of hold, chunks it held when killed.
        drained: leases and claims all gone and the tickets reclaimed, within the lifetimes.
        drain_s: seconds from the kills until drained (the longest lifetime bounds it; reported only).
        bound_s: the longest lifetime (plus one reaping pass).
        half_written_visible: chunks of the unfinished ticket or save a Lookup found (must be 0).
        restored_exact: the unfinished prompts, stored again after the drain, load back bit for bit.
    """

    engines_killed: int
    held: dict[str, int]
    drained: bool
    drain_s: float
    bound_s: float
    half_written_visible: int
    restored_exact: bool


def run_engine_kills(config: EngineKillConfig) -> EngineKillReport:
    """Kill one engine per kind of hold, wait for the drain, check visibility; the figures."""
    sock_dir = Path(tempfile.mkdtemp(prefix="tcfault-"))
    daemon = daemon_process(
        config.daemon, config.work_dir, config.work_dir / "l3", sock_dir / "d.sock", "faults"
    )
    daemon.start()
    engines: list[EngineProcess] = []
    conn = connect(daemon.address)
    try:
        prompt_of = {kind: 500 + i for i, kind in enumerate(HOLDS)}
        store_prompt(conn, prompt_of["hold"], config.chunks)  # what the lease holds
        before = conn.client.stats()
        base = {"address": daemon.address, "chunks": config.chunks, "ttl_s": config.claim_ttl_s}
        engines = [
            engine_process({**base, "mode": k, "prompt": prompt_of[k]}, config.work_dir) for k in HOLDS
        ]
        lines = {kind: e.message() for kind, e in zip(HOLDS, engines, strict=True)}
        during = conn.client.stats()
        logger.info("engines hold: %s (active leases %d)", lines, during.active_leases)
        started = time.monotonic()
        for e in engines:
            e.kill()
        bound = max(config.daemon.lease_ttl_s, config.claim_ttl_s) + 1.0
        drained = False
        while time.monotonic() - started < 3 * bound:
            now = conn.client.stats()
            tickets = now.expired_leases - before.expired_leases
            if now.active_leases == 0 and now.prefill.active_claims == 0 and tickets >= 3:
                drained = True  # the lease, the ticket and the save's ticket were reclaimed
                break
            threading.Event().wait(0.05)  # the reaper runs on daemon calls: ask again shortly
        drain_s = time.monotonic() - started
        visible = 0
        for kind in ("ticket", "save"):
            keys = chunk_keys(conn.namespace, prompt_tokens(prompt_of[kind], config.chunks))
            visible += sum(conn.client.lookup(conn.namespace, [k]).chunks for k in keys)
        restored = True
        for kind in ("ticket", "save", "claim"):
            acked = store_prompt(conn, prompt_of[kind], config.chunks)
            check = load_and_check(conn, prompt_of[kind], config.chunks)
            restored &= acked == config.chunks * LAYOUT.chunk_tokens and check.exact
            restored &= check.tokens_loaded == config.chunks * LAYOUT.chunk_tokens
        held = {
            "hold": int(lines["hold"]["chunks"]),
            "ticket": int(lines["ticket"]["chunks"]),
            "claim": int(lines["claim"]["lead_tokens"]) // LAYOUT.chunk_tokens,
            "save": config.chunks if lines["save"]["open"] else 0,
        }
    finally:
        for e in engines:
            e.close()
        conn.client.close()
        daemon.cleanup()
        shutil.rmtree(sock_dir, ignore_errors=True)
    return EngineKillReport(len(engines), held, drained, drain_s, bound, visible, restored)

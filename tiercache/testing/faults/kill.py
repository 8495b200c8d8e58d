"""Kill -9 of the daemon in the middle of stores, many times in a row on the same L3, with figures.

Each round starts a daemon on the L3 the previous one left, checks what survived, stores a batch of
prompts, notes which chunks L3 holds (asked chunk by chunk through Lookup), starts an engine thread storing
more prompts and SIGKILLs the daemon once that thread has had a few stores acknowledged (so the kill lands
in the middle of its stores and write-downs). After each restart:

- every chunk L3 held at the last snapshot must still be in L3 (``l3_chunks_lost``);
- every acknowledged prompt is loaded and compared bit for bit (``torn_served`` counts loads that put a
  wrong byte into the engine's tensors);
- the L3 environment must never have been moved aside as damaged (``moved_aside``);
- acknowledged chunks that are in no tier any more are the write-down backlog the kill lost: they were
  only in the volatile tiers (L1/L2), so at one kill they are at most the chunks those tiers hold
  (``backlog_bound``: L1 + L2 slots); the worst kill and the total are reported.

Primitives:
    default_daemon: the small daemon of the fault runs (8 KiB slots, 64-slot L2, 64 MiB L3, short TTLs).
    chunks_in_l3 / chunks_anywhere: which chunks of some prompts L3 (any tier) holds, asked chunk by chunk.
    KillConfig: rounds, batch sizes, the daemon and the work directory.
    KillReport: the figures.
    run_kills: run the rounds; the report.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tiercache.connector import KVConnector
from tiercache.keys import chunk_keys
from tiercache.policies import WritePolicyKind
from tiercache.tiers.base import TierLevel

from ..daemon import DaemonProcess
from ..embedded import EmbeddedDaemonConfig, daemon_process
from .workload import LAYOUT, connect, load_and_check, prompt_tokens, store_prompt

logger = logging.getLogger(__name__)

_STORER_TIMEOUT_S = 60.0


def default_daemon() -> EmbeddedDaemonConfig:
    """The small daemon of the fault runs: one 8 KiB slot per chunk, 64 L2 slots, 64 MiB of L3."""
    return EmbeddedDaemonConfig(
        slot_bytes=LAYOUT.chunk_bytes,
        l1_device="none",
        l2_bytes=64 * LAYOUT.chunk_bytes,
        l3_bytes=64 << 20,
        write_policy=WritePolicyKind.WRITE_THROUGH,
        lease_ttl_s=5.0,
        max_ttl_s=30.0,
    )


@dataclass(frozen=True, slots=True)
class KillConfig:
    """What a kill run does.

    Attributes:
        work_dir: an existing directory the run owns (L3, daemon logs).
        kills: SIGKILLs (one more daemon is started at the end, to check the last one).
        prompts_per_round: prompts stored and acknowledged before the L3 snapshot of a round.
        stores_before_kill: prompts the engine thread has acknowledged after the snapshot when the kill
            comes (it is storing the next one).
        chunks: chunks per prompt.
        daemon: the daemons' sizes (one slot per chunk).
    """

    work_dir: Path
    kills: int = 20
    prompts_per_round: int = 6
    stores_before_kill: int = 3
    chunks: int = 4
    daemon: EmbeddedDaemonConfig = field(default_factory=default_daemon)


@dataclass(frozen=True, slots=True)
class KillReport:
    """Figures of a kill run.

    Attributes:
        kills: SIGKILLs of the daemon.
        restarts: daemons started on the L3 a killed one left.
        prompts_acknowledged: prompts whose store was acknowledged (all chunks).
        chunks_acknowledged: chunks of those.
        l3_chunks_checked: chunks seen in L3 before a kill and looked for after the restart (summed).
        l3_chunks_lost: of those, missing after the restart (must be 0).
        loads_checked: verified loads after restarts.
        torn_served: loads that put a wrong byte into the engine's tensors (must be 0).
        moved_aside: L3 environments moved aside as damaged (must be 0).
        backlog_lost_total: acknowledged chunks in no tier after a restart, summed over kills.
        backlog_lost_max: the same at the worst kill.
        backlog_bound: the most a kill can lose that way: the L1 + L2 slots (the volatile tiers).
    """

    kills: int
    restarts: int
    prompts_acknowledged: int
    chunks_acknowledged: int
    l3_chunks_checked: int
    l3_chunks_lost: int
    loads_checked: int
    torn_served: int
    moved_aside: int
    backlog_lost_total: int
    backlog_lost_max: int
    backlog_bound: int


class _Storer(threading.Thread):
    """The engine thread storing new prompts until told to stop (it is storing when the kill comes)."""

    def __init__(self, conn: KVConnector, first_prompt: int, chunks: int, want: int) -> None:
        super().__init__(name="faults-storer", daemon=True)
        self.conn, self._next, self._chunks, self._want = conn, first_prompt, chunks, want
        self.acked: list[int] = []
        self.stop_flag = threading.Event()
        self.enough = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            prompt = self._next
            self._next += 1
            if store_prompt(self.conn, prompt, self._chunks) == self._chunks * LAYOUT.chunk_tokens:
                self.acked.append(prompt)
            if len(self.acked) >= self._want:
                self.enough.set()
        self.enough.set()

    @property
    def next_prompt(self) -> int:
        return self._next


def chunks_in_l3(conn: KVConnector, prompts: list[int], chunks: int) -> set[tuple[int, int]]:
    """The (prompt, chunk) pairs of ``prompts`` that L3 holds, asked chunk by chunk through Lookup."""
    held = set()
    for prompt in prompts:
        for i, key in enumerate(chunk_keys(conn.namespace, prompt_tokens(prompt, chunks))):
            if conn.client.lookup(conn.namespace, [key]).by_tier.get(TierLevel.L3, 0):
                held.add((prompt, i))
    return held


def chunks_anywhere(conn: KVConnector, prompts: list[int], chunks: int) -> set[tuple[int, int]]:
    """The (prompt, chunk) pairs of ``prompts`` that some tier holds."""
    held = set()
    for prompt in prompts:
        for i, key in enumerate(chunk_keys(conn.namespace, prompt_tokens(prompt, chunks))):
            if conn.client.lookup(conn.namespace, [key]).chunks:
                held.add((prompt, i))
    return held


@dataclass(slots=True)
class _Tally:
    """What the rounds found so far."""

    acked: list[int] = field(default_factory=list)
    snapshot: set[tuple[int, int]] = field(default_factory=set)
    gone: set[tuple[int, int]] = field(default_factory=set)
    next_prompt: int = 0
    checked: int = 0
    lost: int = 0
    loads: int = 0
    torn: int = 0
    backlog: list[int] = field(default_factory=list)


def _check_restart(conn: KVConnector, t: _Tally, chunks: int) -> None:
    """After a restart: the L3 snapshot is still there, loads are exact, the lost backlog is counted."""
    still = chunks_in_l3(conn, sorted({p for p, _ in t.snapshot}), chunks)
    t.checked += len(t.snapshot)
    t.lost += len(t.snapshot - still)
    missing = {(p, i) for p in t.acked for i in range(chunks)} - chunks_anywhere(conn, t.acked, chunks)
    t.backlog.append(len(missing - t.gone))
    t.gone |= missing
    torn_before = t.torn
    for prompt in t.acked:
        t.loads += 1
        t.torn += not load_and_check(conn, prompt, chunks).exact
    logger.info(
        "restart: %d/%d L3 chunks kept, %d loads (%d torn), %d acknowledged chunks lost",
        len(t.snapshot & still),
        len(t.snapshot),
        len(t.acked),
        t.torn - torn_before,
        t.backlog[-1],
    )


def _store_and_kill(conn: KVConnector, daemon: DaemonProcess, t: _Tally, config: KillConfig) -> None:
    """Store a batch, note what L3 holds, then kill the daemon while an engine thread is storing."""
    full = config.chunks * LAYOUT.chunk_tokens
    for _ in range(config.prompts_per_round):
        if store_prompt(conn, t.next_prompt, config.chunks) == full:
            t.acked.append(t.next_prompt)
        t.next_prompt += 1
    t.snapshot = chunks_in_l3(conn, t.acked, config.chunks)
    storer = _Storer(connect(daemon.address), t.next_prompt, config.chunks, config.stores_before_kill)
    storer.start()
    storer.enough.wait(_STORER_TIMEOUT_S)
    daemon.kill()  # while the storer is in the middle of its next store
    storer.stop_flag.set()
    storer.join(_STORER_TIMEOUT_S)
    storer.conn.client.close()
    t.acked.extend(storer.acked)
    t.next_prompt = storer.next_prompt


def run_kills(config: KillConfig) -> KillReport:
    """Run ``config.kills`` rounds of store, snapshot, store-and-kill, then a last restart; the figures."""
    l3_dir = config.work_dir / "l3"
    sock_dir = Path(tempfile.mkdtemp(prefix="tcfault-"))  # short: a unix socket path has ~107 bytes
    t = _Tally()
    try:
        for round_no in range(config.kills + 1):
            daemon = daemon_process(config.daemon, config.work_dir, l3_dir, sock_dir / "d.sock", "faults")
            daemon.start()
            conn = connect(daemon.address)
            try:
                if round_no > 0:
                    _check_restart(conn, t, config.chunks)
                if round_no < config.kills:
                    _store_and_kill(conn, daemon, t, config)
                else:
                    daemon.stop()
            finally:
                conn.client.close()
                daemon.kill()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    bound = config.daemon.l2_bytes // config.daemon.slot_bytes
    if config.daemon.l1_device != "none":
        bound += config.daemon.l1_bytes // config.daemon.slot_bytes
    return KillReport(
        kills=config.kills,
        restarts=config.kills,
        prompts_acknowledged=len(t.acked),
        chunks_acknowledged=len(t.acked) * config.chunks,
        l3_chunks_checked=t.checked,
        l3_chunks_lost=t.lost,
        loads_checked=t.loads,
        torn_served=t.torn,
        moved_aside=len(list(l3_dir.parent.glob(f"{l3_dir.name}.damaged-*"))),
        backlog_lost_total=sum(t.backlog),
        backlog_lost_max=max(t.backlog, default=0),
        backlog_bound=bound,
    )

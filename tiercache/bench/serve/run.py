"""One run of ``tiercache-bench serve``: every (workload, fits|outgrows, concurrency) cell on every column.

Each column is one or two ``vllm serve`` (:mod:`.columns`: its engine cache the run's, where the working set
outgrows it, or the ideal's, where it fits), started once per repeat and used for every cell (a workload and
concurrency has its own tokens, the same on every server), so a run costs a few server starts. Only one server runs at a
time (a small host cannot hold several engines); with ``repeats`` > 1 the columns are interleaved: every
repeat runs every column, the order rotated. Per cell and column it keeps every request's outcome, the wall
time, what vLLM's ``/metrics`` counted (prompt tokens from its own prefix cache, from the connector) and,
for tiercache, the daemon's per-tier token counters (``Stats``: loaded and engine-reported tokens), and how
fast the host ran around it (a probe just before and just after: :mod:`..common.hostspeed`).

``kill_daemon_at_s``: on the first tiercache server of the first repeat, a timer SIGKILLs the daemon that
many seconds after the column's first cell started (or when its cells end, if sooner), waits
``kill_pause_s`` and starts it again on the same L3 (socket and options unchanged). After the cells and the
restart, a probe sends the largest workload's first turns again: the prompts vLLM's own cache has dropped
must come back from the restarted daemon. The run records when, the failures, and what the new daemon
served.

Primitives:
    ServeBenchConfig: what to run.
    Cell: a (workload, fits, concurrency) cell.
    Measured: one cell on one column.
    ServeResult: every measurement and skipped column of a run.
    cells / workload_of: the cells of a config and the workload of a cell.
    longest_request / engine_cache_tokens: the run's longest request, and its "outgrows" engine cache.
    run_bench: the run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tiercache.cache.config import CacheConfig
from tiercache.connector.client import TierCacheClient
from tiercache.errors import TierCacheError
from tiercache.policies import WritePolicyKind
from tiercache.testing.daemon import DaemonProcess, DaemonStartError
from tiercache.testing.vllm_server import VllmServerError

from ..common.hostspeed import probe_host_ms
from ..vllm_engines.columns import VllmBenchConfig, build_model, prompt
from ..vllm_engines.peers import lmcache_missing
from .client import Outcome, drive
from .columns import TIERCACHE, ColumnKind, Served, ServerPlan, Setup, kv_bytes_per_token, plans, serve_column
from .kill import Killer, KillReport
from .workloads import Workload, WorkloadKind, build, write_jsonl

logger = logging.getLogger(__name__)

TIER_NAMES = ("L1", "L2", "L3", "SHARED")
LIVE_HEADROOM = 1.5
"""The default engine cache holds this many times the largest concurrency's longest requests."""
MIN_ENGINE_TOKENS = 2048
"""The smallest default engine cache (tokens)."""
SETTLED_WAIT_S = 10.0
"""After a cell (and the daemon-kill probe), how long the run waits for the engine's deferred usage reports."""
SETTLED_POLL_S = 0.1
"""How often the run reads the daemon's counters while it waits for them."""


def default_threads(cpus: int | None) -> int:
    """OMP threads of every server: all cores but one. A core left to the daemon, the front end and the
    connector's threads keeps them from descheduling one of the engine's OMP threads while the others wait
    for it (2 cores, chat at concurrency 8: with 2 threads tiercache_l2 was 0.73x plain req/s, with 1 thread
    0.97x, and every column ran faster)."""
    return max(1, (cpus or 1) - 1)


@dataclass(frozen=True, slots=True)
class ServeBenchConfig:
    """What ``tiercache-bench serve`` runs.

    Attributes:
        workloads: the workload kinds.
        concurrency: requests in flight per cell.
        columns: the columns, in run order.
        engine_tokens: the engine KV cache of every column but the ideal (tokens); None: enough for the
            largest concurrency's requests with :data:`LIVE_HEADROOM` (:func:`engine_cache_tokens`).
        sets: the rows to measure: True, the working set fits the engine cache (servers with the ideal's
            cache); False, it outgrows the engine cache (``engine_tokens``).
        outgrow_factor: every workload's working set, in engine caches of ``engine_tokens``.
        max_tokens: output tokens per request.
        block_size: vLLM's block size.
        chunk_tokens: tiercache's chunk size.
        hidden / layers: the model.
        threads: OMP threads of every server (default: one core left to the daemon and the front end).
        repeats: how many times every column runs (interleaved).
        lmcache_python: the interpreter of LMCache's venv ("" skips the LMCache column).
        kill_daemon_at_s: SIGKILL the daemon this long into the first tiercache column (None: never).
        kill_pause_s: how long the daemon stays down.
        write_policy: the tiercache daemons' (default: the daemon's own, so the record measures what a user
            gets).
        seed: weights and tokens.
        workloads_dir: where the workloads' JSONL go (None: the scratch directory).
        kv_transfer_params: sent with every request of every column (vLLM hands them to its KV connector:
            ``{"tiercache_skip_save": true}`` measures tiercache without its saves); empty: none.
    """

    workloads: tuple[WorkloadKind, ...] = tuple(WorkloadKind)
    concurrency: tuple[int, ...] = (1, 8, 32)
    columns: tuple[ColumnKind, ...] = tuple(ColumnKind)
    engine_tokens: int | None = None
    sets: tuple[bool, ...] = (True, False)
    outgrow_factor: float = 4.0
    max_tokens: int = 16
    block_size: int = 32
    chunk_tokens: int = 32  # one block: every block vLLM keeps is served back (the ideal keeps whole blocks)
    hidden: int = 512
    layers: int = 4
    threads: int = field(default_factory=lambda: default_threads(os.cpu_count()))
    repeats: int = 1
    lmcache_python: str = ""
    kill_daemon_at_s: float | None = None
    kill_pause_s: float = 2.0
    write_policy: WritePolicyKind = field(default_factory=lambda: CacheConfig().write_policy)
    seed: int = 0
    workloads_dir: Path | None = None
    kv_transfer_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.engine_tokens is not None and self.engine_tokens <= 0:
            raise ValueError(f"engine_tokens must be > 0, got {self.engine_tokens}")
        for name in ("max_tokens", "block_size", "chunk_tokens", "threads", "repeats"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.concurrency or min(self.concurrency) <= 0:
            raise ValueError(f"concurrency must be positive integers, got {self.concurrency}")
        if self.chunk_tokens % self.block_size:
            raise ValueError(f"chunk_tokens ({self.chunk_tokens}) must be a multiple of block_size")
        for name in ("hidden", "layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.hidden % 128:
            raise ValueError(
                f"hidden must be a multiple of 128 (heads of 64, half as many KV heads), got {self.hidden}"
            )
        if not self.outgrow_factor > 1:
            raise ValueError(f"outgrow_factor must be > 1, got {self.outgrow_factor}")
        if not self.sets or not set(self.sets) <= {True, False}:
            raise ValueError(f"sets must name fits (True) and/or outgrows (False), got {self.sets}")
        if self.kill_daemon_at_s is not None and self.kill_daemon_at_s < 0:
            raise ValueError(f"kill_daemon_at_s must be >= 0, got {self.kill_daemon_at_s}")
        if self.kill_daemon_at_s is not None and not set(self.columns) & set(TIERCACHE):
            raise ValueError("kill_daemon_at_s needs a tiercache column (tiercache_l2 or tiercache_l3)")


@dataclass(frozen=True, slots=True)
class Cell:
    """A workload, sized to fit the engine cache or to outgrow it, at a concurrency."""

    workload: WorkloadKind
    fits: bool
    concurrency: int


@dataclass(frozen=True, slots=True)
class Measured:
    """One cell on one column (one repeat).

    Attributes:
        cell / column / repeat: which.
        outcomes: every request.
        wall_s: from the first request sent to the last answered.
        vllm_hits: prompt tokens vLLM's own prefix cache served (``/metrics``).
        connector_hits: prompt tokens the KV connector served (``/metrics``).
        tiers: per tier, the daemon's ``(load_success_tokens, effective_hit_tokens)`` during the cell.
        counters: tiercache's connector counters during the cell (:data:`CONNECTOR_COUNTERS`; zeros for other columns).
        engine: vLLM's own request timings during the cell (:data:`ENGINE_COUNTERS`): where a TTFT went.
        daemon_restarted: the daemon was killed and restarted during the cell (its counters restarted).
        host_probe_ms: the host's speed probe (:func:`~..common.hostspeed.probe_host_ms`) just before and just
            after the cell, the slower of the two (None: not probed).
    """

    cell: Cell
    column: ColumnKind
    repeat: int
    outcomes: tuple[Outcome, ...]
    wall_s: float
    vllm_hits: int
    connector_hits: int
    tiers: dict[str, tuple[int, int]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    engine: dict[str, float] = field(default_factory=dict)
    daemon_restarted: bool = False
    host_probe_ms: float | None = None


@dataclass(frozen=True, slots=True)
class ServeResult:
    """A run.

    Attributes:
        measured: every (cell, column, repeat).
        skipped: "column (fits|outgrows)" -> why it did not run.
        engine_tokens: per server, what its engine cache held (read back from the server's log).
        workloads: per cell, the workload (for the table: sessions, requests, working set).
        kill: the daemon kill, when asked for.
        wall_s: the whole run.
        longest_request: the longest request's tokens (prompt and output).
    """

    measured: tuple[Measured, ...]
    skipped: dict[str, str]
    engine_tokens: dict[str, int]
    workloads: dict[Cell, Workload]
    kill: KillReport | None
    wall_s: float
    longest_request: int = 0


def cells(config: ServeBenchConfig) -> list[Cell]:
    """Every cell, in run order."""
    return [Cell(w, fits, c) for w in config.workloads for fits in config.sets for c in config.concurrency]


def longest_request(config: ServeBenchConfig) -> int:
    """The longest request (prompt and output) of the run's workloads: a session's length does not depend
    on how many sessions a working set holds."""
    return max(build(kind, 1, config.seed, config.max_tokens).longest_prompt for kind in config.workloads)


def engine_cache_tokens(config: ServeBenchConfig) -> int:
    """The engine cache of the run's "outgrows" servers: ``engine_tokens`` when given, else whole blocks
    holding :data:`LIVE_HEADROOM` times the largest concurrency's longest requests (at least
    :data:`MIN_ENGINE_TOKENS`). A cache that cannot hold the requests in flight caps the engine's batch
    (vLLM queues the rest), which no cache tier can lift: the ideal would then lead by its batch size,
    not by what it caches."""
    if config.engine_tokens is not None:
        return config.engine_tokens
    live = LIVE_HEADROOM * max(config.concurrency) * longest_request(config)
    blocks = -(-int(live) // config.block_size)
    return max(MIN_ENGINE_TOKENS, blocks * config.block_size)


def workload_of(config: ServeBenchConfig, cell: Cell) -> Workload:
    """The seeded workload of ``cell``: its working set outgrows the engine cache
    (:func:`engine_cache_tokens`) by ``outgrow_factor``; the same tokens for its fits and outgrows rows
    (only the server's engine cache differs), its own tokens otherwise."""
    seed = config.seed * 1_000_003 + list(WorkloadKind).index(cell.workload) * 10_007 + cell.concurrency
    tokens = int(engine_cache_tokens(config) * config.outgrow_factor)
    return build(cell.workload, tokens, seed, config.max_tokens)


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


CONNECTOR_COUNTERS = (
    "lookups",
    "index_answers",
    "late_answers",
    "ask_wait_seconds",
    "load_seconds",
    "loaded_tokens",
    "recomputed_tokens",
)
"""The tiercache connector counters the bench reads from vLLM's ``/metrics`` (``vllm:tiercache_<name>``)."""


ENGINE_COUNTERS = (
    "request_queue_time_seconds_sum",
    "request_queue_time_seconds_count",
    "request_prefill_time_seconds_sum",
    "request_prefill_time_seconds_count",
    "num_preemptions_total",
)
"""vLLM's own counters the bench reads (``vllm:<name>``): how long requests waited before their first step
(for blocks, or for a late answer of the connector), how long from then to their first token (the prefill,
loads included), and how often the engine preempted a request for blocks."""


def _vllm_counters(url: str) -> tuple[int, int, dict[str, float], dict[str, float]]:
    """vLLM's prefix-cache and connector hit tokens, tiercache's connector counters (:data:`CONNECTOR_COUNTERS`)
    and vLLM's request timings (:data:`ENGINE_COUNTERS`)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counters = {name: _metric(text, f"vllm:tiercache_{name}_total") for name in CONNECTOR_COUNTERS}
    return (
        int(_metric(text, "vllm:prefix_cache_hits_total")),
        int(_metric(text, "vllm:external_prefix_cache_hits_total")),
        counters,
        {name: _metric(text, f"vllm:{name}") for name in ENGINE_COUNTERS},
    )


def _daemon_tiers(daemon: DaemonProcess | None) -> dict[str, tuple[int, int]]:
    if daemon is None or not daemon.alive():
        return {}
    client = TierCacheClient.connect(daemon.address, timeout_s=10.0)
    try:
        stats = client.stats()
    except TierCacheError as exc:
        logger.warning("daemon stats unavailable: %s", exc)
        return {}
    finally:
        client.close()
    return {t.level.name: (t.load_success_tokens, t.effective_hit_tokens) for t in stats.tiers}


def _probe(served: Served, model: str, workload: Workload) -> tuple[int, int, int]:
    """After a daemon restart: every session's first turn again, one at a time (those that vLLM's own cache
    dropped can only come from the restarted daemon). Returns (requests, failed, tokens the connector
    served, as vLLM counted them)."""
    before = _vllm_counters(served.server.url)[1]
    failed = 0
    for session in workload.sessions:
        body = {
            "model": model,
            "prompt": [*session.prefix, *session.turns[0]],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        try:
            httpx.post(f"{served.server.url}/v1/completions", json=body, timeout=300).raise_for_status()
        except httpx.HTTPError as exc:
            logger.warning("probe request failed: %s", exc)
            failed += 1
    return len(workload.sessions), failed, _vllm_counters(served.server.url)[1] - before


def _settled_tiers(
    daemon: DaemonProcess | None, loaded: int, before: dict[str, tuple[int, int]] | None = None
) -> dict[str, tuple[int, int]]:
    """The daemon's per-tier counters, less ``before``, once the engine's usage reports of ``loaded`` tokens
    (vLLM's count of what the connector served) came in. The worker defers them: they ride on its next call,
    or go alone ``SETTLE_AFTER_S`` later (:mod:`tiercache.connector.settle`), so the last requests' reports
    land after their answers (read at once, a cell lost them to the next cell's baseline: docqa 95,616 of
    96,768 tokens in the record at ``329f4b0``). Waits at most :data:`SETTLED_WAIT_S`; a daemon that never
    reports them all (a load error recomputed, a restart) is read as it is then."""
    if daemon is None:
        return {}
    base = before or {}

    def delta() -> dict[str, tuple[int, int]]:
        got = _daemon_tiers(daemon)
        zero = (0, 0)
        return {n: (v[0] - base.get(n, zero)[0], v[1] - base.get(n, zero)[1]) for n, v in got.items()}

    deadline = time.monotonic() + SETTLED_WAIT_S
    tiers = delta()
    while sum(v[0] for v in tiers.values()) < loaded and time.monotonic() < deadline:
        time.sleep(SETTLED_POLL_S)
        tiers = delta()
    return tiers


def _warm(served: Served, model: str) -> None:
    """One untimed request (a fresh server's first request pays for lazy setup)."""
    body = {"model": model, "prompt": prompt(999_999, 64), "max_tokens": 2, "temperature": 0.0}
    httpx.post(f"{served.server.url}/v1/completions", json=body, timeout=300).raise_for_status()


def _measure_column(
    served: Served, plan: ServerPlan, config: ServeBenchConfig, todo: list[tuple[Cell, Workload]], repeat: int,
    model: str, killer: Killer | None,
) -> list[Measured]:  # fmt: skip
    """Every (workload, concurrency) once on ``served``, recorded as each of the plan's rows."""
    _warm(served, model)
    out = []
    if killer is not None:
        killer.arm()
    fits_rows = {fits for _, fits in plan.rows}
    done: set[tuple[WorkloadKind, int]] = set()
    for cell, workload in todo:
        if cell.fits not in fits_rows or (cell.workload, cell.concurrency) in done:
            continue
        done.add((cell.workload, cell.concurrency))
        logger.info(
            "%s: %s c=%d (%d requests)", plan.name, cell.workload.value, cell.concurrency, workload.requests
        )
        probe = probe_host_ms()
        before_v, before_t = _vllm_counters(served.server.url), _daemon_tiers(served.daemon)
        t0 = time.monotonic()
        outcomes = drive(served.server.url, model, workload, cell.concurrency, config.block_size,
                         kv_transfer_params=config.kv_transfer_params)  # fmt: skip
        t1 = time.monotonic()
        after_v = _vllm_counters(served.server.url)
        restarted = killer is not None and killer.restarted_between(t0, t1)
        # (after a restart the daemon's counters begin again and cannot reach vLLM's count: no wait)
        tiers = _settled_tiers(served.daemon, 0 if restarted else after_v[1] - before_v[1],
                               None if restarted else before_t)  # fmt: skip
        probe = max(probe, probe_host_ms())
        wall = max(o.end for o in outcomes) - min(o.start for o in outcomes)
        counters = {name: after_v[2][name] - before_v[2][name] for name in CONNECTOR_COUNTERS}
        engine = {name: after_v[3][name] - before_v[3][name] for name in ENGINE_COUNTERS}
        shared = tuple(outcomes)  # (one object for every row of the cell: the report counts its probe once)
        for column, fits in plan.rows:
            out.append(Measured(Cell(cell.workload, fits, cell.concurrency), column, repeat, shared, wall,
                                after_v[0] - before_v[0], after_v[1] - before_v[1], tiers, counters, engine, restarted,
                                probe))  # fmt: skip
    return out


def run_bench(config: ServeBenchConfig, work: Path) -> ServeResult:
    """Run every column over every cell (see the module docstring).

    A column whose processes do not start is skipped with the reason (vLLM's error for ``native``); the
    other columns still run.
    """
    started = time.monotonic()
    todo = [(cell, workload_of(config, cell)) for cell in cells(config)]
    wdir = config.workloads_dir or work / "workloads"
    wdir.mkdir(parents=True, exist_ok=True)
    for cell, workload in todo:
        write_jsonl(workload, wdir / f"{cell.workload.value}-c{cell.concurrency}.jsonl")
    longest = max(w.longest_prompt for _, w in todo)
    max_len = -(-(longest + config.block_size) // config.block_size) * config.block_size
    engine_tokens = engine_cache_tokens(config)
    if max_len > engine_tokens:
        raise ValueError(f"engine_tokens ({engine_tokens}) must hold the longest request ({max_len} tokens)")
    biggest = max(w.working_set_tokens for _, w in todo)
    # One daemon serves every cell of its server in turn: its L2 holds what all of them store.
    stored = sum(w.working_set_tokens for _, w in todo)
    margin = (max(config.concurrency) + 2) * config.block_size * 2
    model = build_model(work / "model", VllmBenchConfig(lengths=(max_len,), hidden=config.hidden,
                                                        layers=config.layers, throughput=False, seed=config.seed))  # fmt: skip
    setup = Setup(model, work, engine_tokens, biggest + margin, 2 * stored, max_len, config.block_size,
                  config.chunk_tokens, kv_bytes_per_token(config.hidden, config.layers), config.threads,
                  config.lmcache_python, config.write_policy)  # fmt: skip
    skipped: dict[str, str] = {}
    if ColumnKind.LMCACHE in config.columns:
        missing = lmcache_missing(config.lmcache_python)
        if missing:
            skipped[ColumnKind.LMCACHE.value] = missing
    measured: list[Measured] = []
    engine: dict[str, int] = {}
    kill: KillReport | None = None
    servers = [p for p in plans(config.columns, config.sets) if p.kind.value not in skipped]
    kill_plan = next((p for p in servers if p.kind in TIERCACHE), None)
    for repeat in range(config.repeats):
        turn = repeat % max(1, len(servers))
        for plan in servers[turn:] + servers[:turn]:
            try:
                with serve_column(plan.kind, setup, plan.big) as served:
                    engine[plan.name] = served.server.kv_cache_tokens
                    killer = None
                    if config.kill_daemon_at_s is not None and plan is kill_plan and repeat == 0:
                        assert served.daemon is not None
                        killer = Killer(served.daemon, config.kill_daemon_at_s, config.kill_pause_s)
                    try:
                        got = _measure_column(served, plan, config, todo, repeat, str(model), killer)
                    finally:
                        if killer is not None:
                            killer.finish()
                    measured += got
                    if killer is not None:
                        probed = max((w for _, w in todo), key=lambda w: w.working_set_tokens)
                        probe = _probe(served, str(model), probed) if killer.restarted_at >= 0 else (0, 0, 0)
                        after = _settled_tiers(served.daemon, probe[2])
                        kill = KillReport(plan.name, killer.killed_at, killer.restarted_at,
                                          sum(1 for m in got for o in m.outcomes if o.error),
                                          sum(v[0] for v in after.values()), *probe, killer.error)  # fmt: skip
            except (VllmServerError, DaemonStartError, RuntimeError, OSError) as exc:
                reason = _why(exc)
                logger.warning("server %s skipped: %s", plan.name, reason)
                for column, fits in plan.rows:
                    skipped[f"{column.value} ({'fits' if fits else 'outgrows'})"] = reason
    return ServeResult(
        tuple(measured), skipped, engine, dict(todo), kill, time.monotonic() - started, longest
    )


def _why(exc: BaseException) -> str:
    """The telling line of a failure (vLLM's own error where its log has one)."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        if "Error:" in line and "Engine core initialization failed" not in line:
            return line.strip()[-400:]
    return text.strip().splitlines()[0][-400:] if text.strip() else type(exc).__name__

"""The ``workload`` benchmark: traces replayed through the cache, token-weighted hits per tier.

For each trace and each L2 size of the sweep a fresh cache (in-process manager, or a daemon started for
the run) serves the trace's requests in order (see :mod:`tiercache.bench.workload.replay`). The three measures of
a hit are kept apart, token-weighted (design: "Measures of a hit"): lookup hit (the index had it), load
success (bytes arrived intact in engine memory) and effective hit (prefill the engine skipped). The
prefill saved is the effective hit at the declared prefill rate.

Primitives:
    TraceInput: a named trace (synthetic or from a file).
    WorkloadConfig: traces, sizes, replay options, where to run.
    WorkloadRun: the figures of one trace at one cache size.
    WorkloadReport: the whole run.
    run_workload: run the benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout
from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon
from tiercache.tiers.base import TierLevel

from ..ceilings import MachineInfo, describe_machine
from ..common.progress import ProgressBar
from ..common.workdir import work_directory
from .reference import ReferenceKind, reference_hit_chunks
from .replay import CacheSizes, DaemonTarget, InprocTarget, ReplayOptions, ReplayTarget, TierCounters
from .traces import TraceRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, eq=False)
class TraceInput:
    """A trace to replay.

    Attributes:
        name: the trace's name (synthetic kind or file name).
        requests: its requests, in order.
    """

    name: str
    requests: tuple[TraceRequest, ...]


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadConfig:
    """What the ``workload`` benchmark replays and on what.

    Attributes:
        traces: the traces.
        l1_bytes: L1 capacity (0: none).
        l2_sizes: L2 capacities to sweep.
        l3_bytes: L3 capacity (0: none).
        options: how requests are served.
        inproc: replay through an in-process cache manager (else a daemon via the connector).
        address: a running daemon (its own sizes apply; no sweep), or None to start one per size.
        token: its bearer token.
        daemon: template of a started daemon (sizes and policies are set from the fields above).
        work_root: where the work directory goes.
    """

    traces: tuple[TraceInput, ...]
    l1_bytes: int
    l2_sizes: tuple[int, ...]
    l3_bytes: int
    options: ReplayOptions
    inproc: bool = True
    address: str | None = None
    token: str | None = None
    daemon: EmbeddedDaemonConfig = field(default_factory=EmbeddedDaemonConfig)
    work_root: Path | None = None

    def __post_init__(self) -> None:
        if not self.traces or not self.l2_sizes:
            raise ValueError("at least one trace and one L2 size are needed")
        if self.address is not None and (self.inproc or len(self.l2_sizes) > 1):
            raise ValueError("--address replays on that daemon's sizes: no --inproc and no L2 sweep")
        if min(self.l2_sizes) < self.options.layout.chunk_bytes:
            raise ValueError(f"L2 must hold at least one chunk of {self.options.layout.chunk_bytes} bytes")


@dataclass(frozen=True, slots=True)
class WorkloadRun:
    """One trace replayed at one cache size.

    Attributes:
        trace: the trace's name.
        sizes: tier capacities (for ``--address``: the daemon's).
        requests: requests served.
        prompt_tokens: tokens of all prompts.
        looked_up_tokens: tokens of their full chunks (what a cache could serve).
        lookup_hit_tokens: tokens the lookups found cached.
        load_success_tokens: tokens loaded intact into engine memory.
        effective_hit_tokens: prefill tokens the engine skipped.
        stored_tokens: tokens of chunks the cache added.
        tiers: per-tier counters.
        load_s: time in lookups and loads.
        store_s: time in stores.
        prefill_saved_s: ``effective_hit_tokens / prefill_tokens_per_s``.
        verified_bytes: loaded bytes compared with their source.
        elapsed_s: wall time of the replay.
        min_hit_tokens: tokens Belady's MIN would have hit on the same trace and capacity (the optimum).
        lru_hit_tokens: tokens plain LRU would have hit on the same trace and capacity.
        reference_chunks: the capacity of both references, in chunks (every tier's slots together).
    """

    trace: str
    sizes: CacheSizes
    requests: int
    prompt_tokens: int
    looked_up_tokens: int
    lookup_hit_tokens: int
    load_success_tokens: int
    effective_hit_tokens: int
    stored_tokens: int
    tiers: tuple[TierCounters, ...]
    load_s: float
    store_s: float
    prefill_saved_s: float
    verified_bytes: int
    elapsed_s: float
    min_hit_tokens: int
    lru_hit_tokens: int
    reference_chunks: int

    def rate(self, tokens: int) -> float:
        """``tokens / looked_up_tokens`` (0 when nothing could be looked up)."""
        return tokens / self.looked_up_tokens if self.looked_up_tokens else 0.0

    def l3_traffic(self) -> tuple[int, int] | None:
        """Bytes written into L3 (stores and write-downs) and bytes read back out of it; None: no L3.

        Read back = the larger of the bytes loaded into the engine from L3 and the bytes promoted into L2
        (L2 promotes only from L3): a chunk promoted for a load is counted by both, so their sum would count
        it twice; the larger is a lower bound of the bytes read (so the amplification is not understated).
        """
        by = {t.level: t for t in self.tiers}
        l3, l2 = by.get(TierLevel.L3), by.get(TierLevel.L2)
        if l3 is None:
            return None
        read = max(l3.loaded_bytes, l2.promoted_bytes if l2 is not None else 0)
        return l3.stored_bytes + l3.demoted_bytes, read

    def l3_write_amplification(self) -> float | None:
        """Bytes written into L3 per byte read back out of it (:meth:`l3_traffic`).

        None: no L3, or nothing written and nothing read; ``math.inf``: written but never read back.
        """
        traffic = self.l3_traffic()
        if traffic is None or traffic == (0, 0):
            return None
        written, read = traffic
        return written / read if read else math.inf


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """The outcome of one ``workload`` run.

    Attributes:
        config: what was asked for.
        machine: what it ran on.
        runs: one per trace and L2 size.
        elapsed_s: wall time.
    """

    config: WorkloadConfig
    machine: MachineInfo
    runs: tuple[WorkloadRun, ...]
    elapsed_s: float


@contextlib.contextmanager
def _target(config: WorkloadConfig, sizes: CacheSizes, work: Path, max_tokens: int) -> Iterator[ReplayTarget]:
    target: ReplayTarget
    if config.inproc:
        target = InprocTarget(config.options, sizes, work)
        try:
            yield target
        finally:
            target.close()
        return
    d = config.daemon
    daemon = EmbeddedDaemonConfig(
        slot_bytes=config.options.layout.chunk_bytes,
        l1_device=d.l1_device if sizes.l1_bytes else "none",
        l1_bytes=max(sizes.l1_bytes, config.options.layout.chunk_bytes),
        l2_bytes=sizes.l2_bytes,
        l3_bytes=sizes.l3_bytes,
        write_policy=config.options.write_policy,
        eviction_policy=config.options.eviction_policy,
    )
    sub = work / f"daemon-{sizes.l2_bytes}"
    sub.mkdir(exist_ok=True)
    with use_daemon(config.address, config.token, daemon, sub) as handle:
        target = DaemonTarget(config.options, handle, max_tokens)
        try:
            yield target
        finally:
            target.close()


def _replay(
    config: WorkloadConfig, trace: TraceInput, sizes: CacheSizes, work: Path, bar: ProgressBar
) -> WorkloadRun:
    start = time.perf_counter()
    max_tokens = max(len(r.tokens) for r in trace.requests)
    totals = dict.fromkeys(("looked_up", "hit", "loaded", "stored", "verified"), 0)
    load_s = store_s = 0.0
    with _target(config, sizes, work, max_tokens) as target:
        for request in trace.requests:
            out = target.serve(request.tokens)
            totals["looked_up"] += out.looked_up
            totals["hit"] += out.hit
            totals["loaded"] += out.loaded
            totals["stored"] += out.stored
            totals["verified"] += out.verified_bytes
            load_s += out.load_s
            store_s += out.store_s
            bar.advance()
        tiers = target.counters()
    if config.address is not None:
        caps = {t.level.name: t.capacity_bytes for t in tiers}
        sizes = CacheSizes(caps.get("L1", 0), caps.get("L2", 0), caps.get("L3", 0))
    chunk = config.options.layout.chunk_bytes
    capacity = sum(n // chunk for n in (sizes.l1_bytes, sizes.l2_bytes, sizes.l3_bytes))
    keyed = _reference_keys(trace, config.options.layout)
    c = config.options.layout.chunk_tokens
    return WorkloadRun(
        trace=trace.name,
        sizes=sizes,
        requests=len(trace.requests),
        prompt_tokens=sum(len(r.tokens) for r in trace.requests),
        looked_up_tokens=totals["looked_up"],
        lookup_hit_tokens=totals["hit"],
        load_success_tokens=totals["loaded"],
        effective_hit_tokens=totals["loaded"],
        stored_tokens=totals["stored"],
        tiers=tiers,
        load_s=load_s,
        store_s=store_s,
        prefill_saved_s=totals["loaded"] / config.options.prefill_tokens_per_s,
        verified_bytes=totals["verified"],
        elapsed_s=time.perf_counter() - start,
        min_hit_tokens=c * reference_hit_chunks(keyed, capacity, ReferenceKind.MIN),
        lru_hit_tokens=c * reference_hit_chunks(keyed, capacity, ReferenceKind.LRU),
        reference_chunks=capacity,
    )


def _reference_keys(trace: TraceInput, layout: KVLayout) -> list[list[bytes]]:
    ns = Namespace("tiercache-bench/reference", "0", layout)
    return [chunk_keys(ns, r.tokens) for r in trace.requests]


def run_workload(config: WorkloadConfig, progress: bool = False) -> WorkloadReport:
    """Replay every trace at every L2 size; see the module docstring.

    Raises:
        RoundTripError: a loaded chunk differed from the stored one.
        DaemonStartError: an embedded daemon did not start.
        TierCacheError: the cache refused the configuration or a call failed.
    """
    start = time.perf_counter()
    runs = []
    steps = sum(len(t.requests) for t in config.traces) * len(config.l2_sizes)
    with work_directory(config.work_root) as work, ProgressBar(steps, "workload", progress) as bar:
        device = torch.device(config.options.l1_device if config.l1_bytes else "cpu")
        machine = describe_machine(device, work)
        for trace in config.traces:
            for l2 in config.l2_sizes:
                sizes = CacheSizes(config.l1_bytes, l2, config.l3_bytes)
                run = _replay(config, trace, sizes, work, bar)
                logger.info(
                    "%s at L2 %d MiB: effective hit %.1f%%",
                    trace.name,
                    l2 >> 20,
                    100 * run.rate(run.effective_hit_tokens),
                )
                runs.append(run)
    return WorkloadReport(config, machine, tuple(runs), time.perf_counter() - start)

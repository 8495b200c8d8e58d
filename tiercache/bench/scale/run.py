"""The ``scale`` benchmark: what a full index costs, from a thousand chunks to a million.

For each chunk count of the sweep a fresh in-process cache is filled with prompts of ``prompt_chunks``
chunks each, in one of two ways (:class:`ScaleFill`), then measured.

``cache`` (the default): L2 of exactly that many tiny slots, L3 in a fresh directory, write-through, filled
through the cache one prompt at a time (a minute per hundred thousand chunks on a small machine):

- **lookup**: latency of one ``lookup`` of a stored prompt's keys (random prompts, p50/p99);
- **memory**: the process's anonymous resident memory grown by the fill, per chunk (an upper bound on the
  index's own cost: it also holds the write-down queue and allocator slack; shared memory and LMDB's file
  map are not anonymous and are not counted);
- **eviction**: latency of storing one more prompt into the full L2 (every such store makes room by
  evicting a prompt's worth of chunks), per chunk;
- **warm restart**: the cache closed and built again on the same L3 directory: seconds until it is ready
  (L3 re-indexed), and how many chunks it knows again.

``bulk`` (the way to a million): the chunks are written straight into a fresh L3 directory in large
transactions, in the tier's own format with their depths (:mod:`tiercache.bench.scale.fill`), and a cache
with that L3 alone, full to its capacity, is started on it, through the daemon's code path
(``build_cache``): **warm restart** is that start (wall and CPU seconds: on a loaded machine the wall time
includes other processes' turns), **memory** the anonymous memory it grew by, per chunk (the index of L3
and of the cache, the victim queue), **lookup** as above, **eviction** a store of one more prompt into the
full L3 (room is made by evicting a prompt's worth of the least recently used chunks).

The million-chunk point: ``tiercache-bench scale --fill bulk --counts 1e3,1e4,1e5,1e6`` (about two and
a half minutes on a loaded 2-core machine, most of it the bulk write; 1.1 GiB of L3 in the work directory).

Each figure is compared with its value at the smallest count of the sweep (the issue's targets: lookup
p50 at 1M ≤ 1.2× at 1K, index memory ≤ 200 bytes per chunk, eviction cost independent of the count, a warm
restart over 1M L3 chunks ≤ 10 s).

Primitives:
    ScaleFill: how each point is filled (through the cache, or L3 written in bulk).
    ScaleConfig: the sweep and how each point is filled and measured.
    ScalePoint: the figures at one chunk count.
    ScaleReport: the whole run.
    run_scale: run the benchmark.
"""

from __future__ import annotations

import enum
import gc
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.cache.build import CacheBuildConfig, build_cache
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.write import WritePolicyKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb_config import LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

from ..ceilings import MachineInfo, describe_machine
from ..common.progress import ProgressBar
from ..common.timing import Latency, time_latency
from ..common.workdir import work_directory
from .fill import bulk_fill_l3

logger = logging.getLogger(__name__)

LAYOUT = KVLayout(1, 1, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16)
"""Tiny chunks (1 KiB): the index, not the bytes, is what this benchmark measures."""

DEFAULT_COUNTS = (1_000, 10_000, 100_000, 1_000_000)
"""The sweep of record: a thousand chunks to a million."""

LOOKUP_TARGET = 1.2
MEMORY_TARGET_BYTES = 200
RESTART_TARGET_S = 10.0
_L3_SLACK = 4


class ScaleFill(enum.Enum):
    """How each point of the sweep is filled."""

    CACHE = "cache"
    """Through the cache, one prompt at a time (L2 + L3, write-through); restart rebuilds from that L3."""
    BULK = "bulk"
    """L3 written in bulk; the measured cache is the warm start on it (L3 only)."""


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    """What the ``scale`` benchmark fills and measures.

    Attributes:
        counts: chunk counts of the sweep, ascending (each a fresh cache).
        prompt_chunks: chunks per stored prompt (and per looked-up key list).
        lookups: timed lookups per point.
        evictions: timed stores into the full L2 per point.
        restart: also close and rebuild each cache on its L3 (warm restart); a bulk fill always measures
            the warm start.
        work_root: where the work directory (L3) goes; None for the default.
        seed: prompt generator seed.
        fill: how each point is filled.
    """

    counts: tuple[int, ...] = DEFAULT_COUNTS
    prompt_chunks: int = 64
    lookups: int = 200
    evictions: int = 20
    restart: bool = True
    work_root: Path | None = None
    seed: int = 0
    fill: ScaleFill = ScaleFill.CACHE

    def __post_init__(self) -> None:
        if not self.counts or list(self.counts) != sorted(set(self.counts)):
            raise ValueError("counts must be distinct and ascending, at least one")
        if self.prompt_chunks <= 0 or self.lookups <= 0 or self.evictions <= 0:
            raise ValueError("prompt_chunks, lookups and evictions must be positive")
        if self.counts[0] < self.prompt_chunks:
            raise ValueError(f"the smallest count must hold one prompt of {self.prompt_chunks} chunks")


@dataclass(frozen=True, slots=True)
class ScalePoint:
    """The figures at one chunk count.

    Attributes:
        chunks: chunks indexed (in L2, and written through to L3).
        fill_s: seconds to store them (stores and the write-down, flushed).
        lookup: latency of one lookup of ``prompt_chunks`` keys.
        anon_bytes_per_chunk: anonymous resident memory grown by the fill, per chunk.
        evict_store: latency of one store into the full L2 (it evicts as many chunks as it stores).
        evict_s_per_chunk: ``evict_store.p50_s / prompt_chunks``.
        restart_s: seconds to build the cache again on the same L3 (None: not measured).
        restart_chunks: chunks the rebuilt cache knows in L3 (None: not measured).
        restart_cpu_s: CPU seconds of this process during the restart (None: not measured).
    """

    chunks: int
    fill_s: float
    lookup: Latency
    anon_bytes_per_chunk: float
    evict_store: Latency
    evict_s_per_chunk: float
    restart_s: float | None
    restart_chunks: int | None
    restart_cpu_s: float | None = None


@dataclass(frozen=True, slots=True)
class ScaleReport:
    """The outcome of one ``scale`` run.

    Attributes:
        config: what was asked for.
        machine: what it ran on.
        points: one per chunk count, ascending.
        elapsed_s: wall time.
    """

    config: ScaleConfig
    machine: MachineInfo
    points: tuple[ScalePoint, ...]
    elapsed_s: float


def _rss_anon_bytes() -> int:
    """``RssAnon`` of this process (Linux), 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _prompts(rng: np.random.Generator, ns: Namespace, chunks: int) -> Iterator[list[bytes]]:
    while True:
        yield chunk_keys(ns, rng.integers(0, 2**31, chunks * LAYOUT.chunk_tokens, dtype=np.uint32))


def _store(manager: CacheManager, ns_id: bytes, keys: list[bytes]) -> None:
    ticket = manager.begin_store(ns_id, keys)
    for slot in ticket.slots:
        slot.buffer.fill_(len(slot.key))
    manager.commit_store(ticket.ticket_id)


def _build(count: int, l3_path: Path) -> CacheBuildConfig:
    nbytes = LAYOUT.chunk_bytes
    return CacheBuildConfig(
        cache=CacheConfig(write_policy=WritePolicyKind.WRITE_THROUGH),
        l2=HostTierConfig(count * nbytes, nbytes, f"tiercache-bench-scale-{secrets.token_hex(4)}", pin=False),
        l3=LmdbTierConfig(path=str(l3_path), capacity_bytes=_L3_SLACK * count * nbytes),
    )


def _l3_chunks(manager: CacheManager) -> int:
    return next(t.chunks for t in manager.stats().tiers if t.level is TierLevel.L3)


def _point(config: ScaleConfig, count: int, work: Path, bar: ProgressBar) -> ScalePoint:
    rng = np.random.default_rng(config.seed + count)
    ns = Namespace("tiercache-bench/scale", f"n{count}", LAYOUT)
    prompts = _prompts(rng, ns, config.prompt_chunks)
    l3_path = work / f"l3-{count}"
    build = _build(count, l3_path)
    manager = build_cache(build)
    try:
        ns_id = manager.register_namespace(ns)
        stored: list[list[bytes]] = []
        gc.collect()
        before = _rss_anon_bytes()
        start = time.perf_counter()
        for _ in range(count // config.prompt_chunks):
            keys = next(prompts)
            _store(manager, ns_id, keys)
            stored.append(keys)
            bar.advance(len(keys))
        manager.flush()
        fill_s = time.perf_counter() - start
        gc.collect()
        chunks = len(stored) * config.prompt_chunks
        anon = max(0, _rss_anon_bytes() - before) / chunks
        picks = iter(rng.integers(0, len(stored), config.lookups + 10))
        lookup = time_latency(lambda: manager.lookup(ns_id, stored[int(next(picks))]), config.lookups, 10)
        evict = time_latency(lambda: _store(manager, ns_id, next(prompts)), config.evictions, 2)
        manager.flush()
    finally:
        manager.close()
    restart_s = restart_chunks = restart_cpu_s = None
    if config.restart:
        start, cpu = time.perf_counter(), time.process_time()
        again = build_cache(_build(count, l3_path))
        restart_s, restart_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        try:
            restart_chunks = _l3_chunks(again)
        finally:
            again.close()
    logger.info(
        "%d chunks: lookup p50 %.0f us, %.0f B/chunk, evicting store %.1f us/chunk, restart %s s",
        chunks,
        lookup.p50_s * 1e6,
        anon,
        evict.p50_s / config.prompt_chunks * 1e6,
        "-" if restart_s is None else f"{restart_s:.2f}",
    )
    return ScalePoint(
        chunks=chunks,
        fill_s=fill_s,
        lookup=lookup,
        anon_bytes_per_chunk=anon,
        evict_store=evict,
        evict_s_per_chunk=evict.p50_s / config.prompt_chunks,
        restart_s=restart_s,
        restart_chunks=restart_chunks,
        restart_cpu_s=restart_cpu_s,
    )


def _bulk_point(config: ScaleConfig, count: int, work: Path, bar: ProgressBar) -> ScalePoint:
    """One point of a ``bulk`` sweep: L3 written in bulk, then the warm start on it measured."""
    rng = np.random.default_rng(config.seed + count)
    ns = Namespace("tiercache-bench/scale", f"n{count}", LAYOUT)
    prompts = _prompts(rng, ns, config.prompt_chunks)
    chunks = count // config.prompt_chunks * config.prompt_chunks
    l3 = LmdbTierConfig(
        path=str(work / f"l3-{count}"), capacity_bytes=chunks * (HEADER_BYTES + LAYOUT.chunk_bytes)
    )
    start = time.perf_counter()
    stored = bulk_fill_l3(l3, ns.namespace_id, prompts, count, LAYOUT.chunk_bytes, bar.advance)
    fill_s = time.perf_counter() - start
    gc.collect()
    before = _rss_anon_bytes()
    start, cpu = time.perf_counter(), time.process_time()
    manager = build_cache(CacheBuildConfig(cache=CacheConfig(), l3=l3))
    restart_s, restart_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    try:
        gc.collect()
        anon = max(0, _rss_anon_bytes() - before) / chunks
        restart_chunks = _l3_chunks(manager)
        ns_id = manager.register_namespace(ns)
        picks = iter(rng.integers(0, len(stored), config.lookups + 10))
        lookup = time_latency(lambda: manager.lookup(ns_id, stored[int(next(picks))]), config.lookups, 10)
        evict = time_latency(lambda: _store(manager, ns_id, next(prompts)), config.evictions, 2)
    finally:
        manager.close()
    logger.info(
        "%d chunks (bulk): restart %.2f s (%.2f s CPU), %.0f B/chunk, lookup p50 %.0f us, evicting store %.1f us/chunk",
        chunks,
        restart_s,
        restart_cpu_s,
        anon,
        lookup.p50_s * 1e6,
        evict.p50_s / config.prompt_chunks * 1e6,
    )
    return ScalePoint(
        chunks=chunks,
        fill_s=fill_s,
        lookup=lookup,
        anon_bytes_per_chunk=anon,
        evict_store=evict,
        evict_s_per_chunk=evict.p50_s / config.prompt_chunks,
        restart_s=restart_s,
        restart_chunks=restart_chunks,
        restart_cpu_s=restart_cpu_s,
    )


def run_scale(config: ScaleConfig, progress: bool = False) -> ScaleReport:
    """Fill and measure a cache at every chunk count of the sweep; see the module docstring.

    Raises:
        TierCacheError: a tier refused its configuration (e.g. not enough shared memory).
        OSError: the system refused memory or files.
    """
    start = time.perf_counter()
    points = []
    steps = sum(c // config.prompt_chunks * config.prompt_chunks for c in config.counts)
    with work_directory(config.work_root) as work, ProgressBar(steps, "scale", progress) as bar:
        machine = describe_machine(torch.device("cpu"), work)
        measure = _bulk_point if config.fill is ScaleFill.BULK else _point
        for count in config.counts:
            points.append(measure(config, count, work, bar))
    return ScaleReport(config, machine, tuple(points), time.perf_counter() - start)

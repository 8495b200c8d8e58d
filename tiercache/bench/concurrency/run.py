"""The ``concurrency`` benchmark run: aggregate put+get GB/s of an in-process cache manager under T threads,
next to a memcpy ceiling measured in the same run; every round trip is verified byte for byte.

Each thread stores chunks under keys of its own (``put``) and reads each one straight back (``get``),
comparing it with what it stored. A round trip moves the chunk twice (in and out), so its bytes count twice.
Aggregate GB/s is the bytes of all threads over the longest thread's busy time in put/get (verification is
excluded from the timing, but runs on every round trip). The manager sits on L2 (shared memory), optionally
with L1 (CPU or CUDA device) and L3 (LMDB in a temporary directory); L2 holds a window of chunks per thread,
so old chunks are evicted as the run goes.

The hot loop uses only the manager API that predates the cache split (``register_namespace``, ``put``,
``get``), so the same loop can measure an older checkout for comparison.

Primitives:
    ConcurrencyConfig, ConcurrencyResult: what to run, one (threads, chunk size) figure.
    run_concurrency: the measurement (its JSON document).
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tiercache.cache import CacheBuildConfig, CacheManager, build_cache
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.tiers.base import TierLevel
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.values import HEADER_BYTES

from ..ceilings import describe_machine, measure_memcpy
from ..common.tier_ops import RoundTripError
from ..common.timing import summarize

WINDOW_CHUNKS = 16
"""L2 (and L1/L3) slots per thread: a chunk is read back long before other threads could evict it."""


@dataclass(frozen=True, slots=True)
class ConcurrencyConfig:
    """What to run.

    Attributes:
        thread_counts: thread counts to measure, e.g. (1, 2, 4).
        chunk_sizes: chunk sizes in bytes.
        bytes_per_thread: payload bytes each thread stores (and reads back) per chunk size.
        levels: tiers of the manager; L2 is always among them.
        l1_device: device of L1 when present.
        work_root: parent of the temporary L3 directory (None: the system temp dir).
    """

    thread_counts: tuple[int, ...] = (1, 2, 4)
    chunk_sizes: tuple[int, ...] = (1 << 20, 4 << 20)
    bytes_per_thread: int = 64 << 20
    levels: tuple[TierLevel, ...] = (TierLevel.L2,)
    l1_device: str = "cpu"
    work_root: Path | None = None


@dataclass(frozen=True, slots=True)
class ConcurrencyResult:
    """One (threads, chunk size) figure.

    Attributes:
        threads: threads running round trips at once.
        chunk_bytes: bytes per chunk.
        round_trips: put+get round trips, all threads.
        verified_bytes: bytes compared with what was stored (every round trip).
        gbps: aggregate GB/s (decimal) of put+get bytes over the longest thread's busy time.
        p50_ms, p99_ms: latency of one round trip.
    """

    threads: int
    chunk_bytes: int
    round_trips: int
    verified_bytes: int
    gbps: float
    p50_ms: float
    p99_ms: float


def _layout(chunk_bytes: int) -> KVLayout:
    """A bf16 layout of exactly ``chunk_bytes`` per chunk (2 layers x K/V x 16 tokens x 1 head x dim)."""
    head_dim = chunk_bytes // (2 * 2 * 16 * 2)
    if head_dim * 2 * 2 * 16 * 2 != chunk_bytes or head_dim <= 0:
        raise ValueError(f"chunk size {chunk_bytes} must be a positive multiple of 128 bytes")
    return KVLayout(
        num_layers=2,
        num_kv_heads=1,
        head_dim=head_dim,
        dtype=KVDtype.BFLOAT16,
        chunk_tokens=16,
        page_tokens=16,
    )


def _open_cache(config: ConcurrencyConfig, chunk_bytes: int, threads: int, work: Path) -> CacheManager:
    slots = WINDOW_CHUNKS * threads
    prefix = f"tiercache-bench-cc-{secrets.token_hex(4)}"
    l3_bytes = 2 * slots * (chunk_bytes + HEADER_BYTES)
    return build_cache(
        CacheBuildConfig(
            l1=HbmTierConfig(slots * chunk_bytes, chunk_bytes, config.l1_device)
            if TierLevel.L1 in config.levels
            else None,
            l2=HostTierConfig(slots * chunk_bytes, chunk_bytes, prefix, pin=False),
            l3=LmdbTierConfig(path=str(work / f"l3-{secrets.token_hex(4)}"), capacity_bytes=l3_bytes)
            if TierLevel.L3 in config.levels
            else None,
        )
    )


def _measure(config: ConcurrencyConfig, chunk_bytes: int, threads: int, work: Path) -> ConcurrencyResult:
    layout = _layout(chunk_bytes)
    namespace = Namespace("tiercache-bench/concurrency", f"run-{secrets.token_hex(4)}", layout)
    rounds = max(1, config.bytes_per_thread // chunk_bytes)
    cache = _open_cache(config, chunk_bytes, threads, work)
    try:
        ns_id = cache.register_namespace(namespace)
        gen = torch.Generator().manual_seed(chunk_bytes + threads)
        pools = [
            [torch.randint(0, 256, (chunk_bytes,), dtype=torch.uint8, generator=gen) for _ in range(4)]
            for _ in range(threads)
        ]
        keys = [
            chunk_keys(namespace, [t * 1_000_000_007 + i for i in range(rounds * layout.chunk_tokens)])
            for t in range(threads)
        ]
        busy = [0.0] * threads
        durations: list[list[float]] = [[] for _ in range(threads)]
        verified = [0] * threads
        errors: list[BaseException] = []
        start = threading.Barrier(threads)

        def worker(t: int) -> None:
            try:
                start.wait()
                for i, key in enumerate(keys[t]):
                    payload = pools[t][i % len(pools[t])]
                    began = time.perf_counter()
                    cache.put(ns_id, [key], [payload])
                    (got,) = cache.get(ns_id, [key])
                    took = time.perf_counter() - began
                    busy[t] += took
                    durations[t].append(took)
                    if got is None or not torch.equal(got.cpu(), payload):
                        raise RoundTripError(f"thread {t}, chunk {i}: read back other bytes than stored")
                    verified[t] += got.numel()
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(t,), name=f"cc-{t}") for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        if errors:
            raise errors[0]
    finally:
        cache.close()
    total = 2 * chunk_bytes * rounds * threads
    timing = summarize(total, max(busy), [d for ds in durations for d in ds])
    return ConcurrencyResult(
        threads, chunk_bytes, rounds * threads, sum(verified), timing.gbps, timing.p50_ms, timing.p99_ms
    )


def run_concurrency(config: ConcurrencyConfig) -> dict[str, Any]:
    """Measure every (chunk size, thread count) and a memcpy ceiling per chunk size; returns the JSON document.

    Raises:
        RoundTripError: a round trip read back other bytes (or nothing).
    """
    work = Path(tempfile.mkdtemp(prefix="tiercache-bench-cc-", dir=config.work_root))
    try:
        results = []
        ceilings = []
        for chunk_bytes in config.chunk_sizes:
            n = 16
            srcs = [torch.randint(0, 256, (chunk_bytes,), dtype=torch.uint8) for _ in range(n)]
            memcpy = measure_memcpy(srcs, [torch.empty_like(s) for s in srcs], batch=1, warmup_rounds=2)
            ceilings.append(
                {
                    "kind": "memcpy",
                    "device": memcpy.device,
                    "chunk_bytes": chunk_bytes,
                    "gbps": memcpy.timing.gbps,
                }
            )
            for threads in config.thread_counts:
                results.append(asdict(_measure(config, chunk_bytes, threads, work)))
        machine = asdict(describe_machine(torch.device(config.l1_device), work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "command": "concurrency",
        "manager": CacheManager.__module__,
        "machine": machine,
        "config": {
            "thread_counts": list(config.thread_counts),
            "chunk_sizes": list(config.chunk_sizes),
            "bytes_per_thread": config.bytes_per_thread,
            "tiers": [lv.name for lv in config.levels],
            "window_chunks_per_thread": WINDOW_CHUNKS,
        },
        "results": results,
        "ceilings": ceilings,
    }

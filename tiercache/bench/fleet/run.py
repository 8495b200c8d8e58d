"""The ``fleet`` benchmark run: a trace spread over several hosts, with the shared tier off and on.

Each host is one daemon's cache (a :class:`~tiercache.cache.manager.CacheManager` built by
:func:`~tiercache.cache.build.build_cache` exactly as the daemon builds it: its own L2 segment, its own L3
directory) in this process; with the shared tier on, every host's cache ends in the same Redis Cluster. The
requests of one trace are dealt to the hosts at random (seeded) and served in trace order the way an
engine would: look the prompt up (counted), lease and copy the cached prefix (every loaded byte checked
against the bytes a chunk's key stands for: a mismatch is an error, never a figure), report the effective
hit, then store the chunks it had to compute. Write-downs are waited for after each request, so a chunk one
host stored is in the cluster before the next request (a fleet's requests are spread in time).

The figures per mode: token-weighted lookup hits, effective hits (tokens loaded into engine memory =
prefill tokens saved) by the tier they came from, and the effective hit rate; the difference between the
modes is what the shared tier is worth for that trace.

Primitives:
    FleetConfig: hosts, sizes, trace, the store to use.
    ModeResult: one mode's figures.
    FleetReport: both modes.
    run_fleet: run the trace with the shared tier off, then on.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tiercache.cache import CacheBuildConfig, CacheConfig, CacheManager, build_cache
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.redis import redis_cluster
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig

from ..common.tier_ops import RoundTripError
from ..workload.replay import chunk_payload
from ..workload.traces import TraceKind, TraceRequest, TraceSpec, generate_trace

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """What ``fleet`` runs.

    Attributes:
        hosts: daemons (hosts) the requests are spread over.
        layout: the KV layout (its ``chunk_bytes`` is the L2 slot size).
        l2_bytes: each host's L2 capacity.
        l3_bytes: each host's L3 capacity (0: no L3).
        trace: the trace kind; ``spec`` its sizes.
        shared_url: the store of the "on" mode; "" for a private three-master cluster started for the run.
        seed: how requests are dealt to hosts.
    """

    hosts: int = 2
    layout: KVLayout = field(
        default_factory=lambda: KVLayout(8, 4, 64, KVDtype.BFLOAT16, chunk_tokens=256, page_tokens=16)
    )
    l2_bytes: int = 64 << 20
    l3_bytes: int = 0
    trace: TraceKind = TraceKind.RAG
    spec: TraceSpec = field(default_factory=lambda: TraceSpec(requests=200, documents=64, docs_per_request=2))
    shared_url: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ValueError(f"hosts: must be positive, got {self.hosts}")
        if self.l2_bytes < self.layout.chunk_bytes:
            raise ValueError(f"l2_bytes: {self.l2_bytes} cannot hold one chunk of {self.layout.chunk_bytes}")


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One mode's figures (tokens of full chunks only).

    Attributes:
        shared: whether the shared tier was on.
        requests: requests served.
        prompt_tokens: tokens of the prompts' full chunks.
        lookup_hit_tokens: tokens of the cached prefixes the hosts found.
        loaded_tokens: tokens loaded into engine memory (prefill tokens saved), by source tier.
        stored_tokens: tokens the hosts computed and stored.
        verified_bytes: loaded bytes compared equal to what was stored.
        shared_errors: failed calls to the store (0 when off).
        elapsed_s: wall time of the mode.
    """

    shared: bool
    requests: int
    prompt_tokens: int
    lookup_hit_tokens: int
    loaded_tokens: Mapping[TierLevel, int]
    stored_tokens: int
    verified_bytes: int
    shared_errors: int
    elapsed_s: float

    @property
    def saved_tokens(self) -> int:
        """Prefill tokens the engines skipped."""
        return sum(self.loaded_tokens.values())

    @property
    def effective_hit_rate(self) -> float:
        """Saved tokens / prompt tokens."""
        return self.saved_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class FleetReport:
    """Both modes of one run, and where the store was."""

    config: FleetConfig
    store: str
    off: ModeResult
    on: ModeResult


def _build(config: FleetConfig, host: int, work: Path, shared: SharedTierConfig | None) -> CacheManager:
    nbytes = config.layout.chunk_bytes
    l3 = None
    if config.l3_bytes:
        l3 = LmdbTierConfig(
            path=str(work / f"l3-{host}-{secrets.token_hex(3)}"), capacity_bytes=config.l3_bytes
        )
    return build_cache(
        CacheBuildConfig(
            cache=CacheConfig(),
            l2=HostTierConfig(
                config.l2_bytes, nbytes, f"tiercache-bench-fleet-{secrets.token_hex(4)}", pin=False
            ),
            l3=l3,
            shared=shared,
        )
    )


def _serve(
    cache: CacheManager, ns_id: bytes, ns: Namespace, tokens: np.ndarray
) -> tuple[int, int, dict[TierLevel, int], int, int]:
    """One request: (prompt tokens, lookup-hit tokens, loaded tokens by source, stored tokens, verified bytes)."""
    c = ns.layout.chunk_tokens
    keys = chunk_keys(ns, tokens)
    found = cache.lookup(ns_id, keys, count=True).chunks
    loaded: dict[TierLevel, int] = {}
    verified = 0
    if found:
        ticket = cache.acquire(ns_id, keys[:found])
        try:
            for ch in ticket.chunks:
                got = ch.view.to("cpu", copy=True)
                if not torch.equal(got, chunk_payload(ch.key, got.numel())):
                    raise RoundTripError(
                        f"chunk {ch.index} ({ch.key.hex()[:16]}) loaded other bytes than stored"
                    )
                verified += got.numel()
                loaded[ch.source] = loaded.get(ch.source, 0) + c
        finally:
            if ticket.lease_id:
                cache.release(ticket.lease_id)
    cache.report_usage(ns_id, loaded, found * c - sum(loaded.values()), loaded)
    todo = keys[sum(loaded.values()) // c :]
    stored = 0
    if todo:
        start = len(keys) - len(todo)
        payloads = [chunk_payload(k, ns.layout.chunk_bytes) for k in todo]
        stored = cache.put(ns_id, todo, payloads, start_depth=start) * c
    cache.flush()
    return len(keys) * c, found * c, loaded, stored, verified


def _run_mode(
    config: FleetConfig, trace: Sequence[TraceRequest], assign: np.ndarray, work: Path, url: str
) -> ModeResult:
    shared = SharedTierConfig(url=url, key_prefix=f"fleet-{secrets.token_hex(4)}:") if url else None
    ns = Namespace("tiercache-bench/fleet", f"run-{secrets.token_hex(4)}", config.layout)
    caches: list[CacheManager] = []
    try:
        for host in range(config.hosts):
            caches.append(_build(config, host, work, shared))
        ns_ids = [cache.register_namespace(ns) for cache in caches]
        totals = [0, 0, 0, 0]
        loaded: dict[TierLevel, int] = {}
        start = time.perf_counter()
        for req, host in zip(trace, assign, strict=True):
            prompt, hit, got, stored, verified = _serve(caches[host], ns_ids[host], ns, req.tokens)
            for i, v in enumerate((prompt, hit, stored, verified)):
                totals[i] += v
            for level, tokens in got.items():
                loaded[level] = loaded.get(level, 0) + tokens
        elapsed = time.perf_counter() - start
        errors = sum(c.stats().tier(TierLevel.SHARED).errors for c in caches if TierLevel.SHARED in c.levels)
    finally:
        for cache in caches:
            cache.close()
    return ModeResult(
        bool(url), len(trace), totals[0], totals[1], loaded, totals[2], totals[3], errors, elapsed
    )


@contextlib.contextmanager
def _store(config: FleetConfig, work: Path) -> Iterator[tuple[str, str]]:
    if config.shared_url:
        yield config.shared_url, config.shared_url
        return
    with redis_cluster(work / "redis", maxmemory="1gb") as cluster:
        yield (
            cluster.url,
            f"redis-server {cluster.version}, 3-master cluster on loopback (started by the bench)",
        )


def run_fleet(config: FleetConfig, work: Path) -> FleetReport:
    """Run the trace over the hosts with the shared tier off, then on (fresh caches each time).

    Raises:
        RoundTripError: a loaded chunk differs from what was stored.
        RedisToolsMissing / RuntimeError: no cluster could be started.
    """
    trace = generate_trace(config.trace, config.spec)
    assign = np.random.default_rng(config.seed).integers(0, config.hosts, size=len(trace))
    with _store(config, work) as (url, store):
        off = _run_mode(config, trace, assign, work, "")
        logger.info("shared tier off: effective hit rate %.3f", off.effective_hit_rate)
        on = _run_mode(config, trace, assign, work, url)
        logger.info("shared tier on: effective hit rate %.3f", on.effective_hit_rate)
    return FleetReport(config, store, off, on)

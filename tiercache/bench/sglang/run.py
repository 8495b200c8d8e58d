"""``sglang``: throughput of SGLang HiCache's zero-copy storage calls through ``TierCacheStorage``, as ratios
to memcpy of the same bytes measured in the same run.

Two SGLang "servers" (two backends made by SGLang's own ``StorageBackendFactory``, each with its own real
host KV pool on the CPU: :mod:`tiercache.testing.sglang`) share one daemon. Each round stores a fresh batch
of pages from the first server's pool (``batch_set_v1``), asks the second how many it finds
(``batch_exists``) and loads them into the second pool (``batch_get_v1``); every load is checked bit-exact
against what was stored. The first :data:`WARMUP_ROUNDS` rounds are untimed: they register the namespace,
map the daemon's shared memory and touch every page of a started daemon's L2 (sized for two batches by the
command), so that the timed rounds copy into pages the kernel has already mapped, evicting as a full cache
does, rather than timing first-touch page faults (which halved the store figure of the first rounds).
Right before each timed call a memcpy pass copies the same bytes in page-size
copies (the same-host ceiling: what a copy of the pages costs with nothing around it); each round's ratio is
to its own pass, and the median ratio is kept with the lowest and highest (:mod:`..common.spread`).

Primitives:
    SglangBenchConfig: the pool's geometry, the batch and the rounds.
    SglangReport: the figures.
    measure_sglang: run the measurement against a daemon address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from tiercache.connector.config import DataPlaneMode
from tiercache.testing.sglang import PoolShape, attach, fill, host_pool, page_hashes, pages_of, storage_config

from ..ceilings import measure_memcpy
from ..common.spread import RatioSpread, Spread, paired_ratios, spread_of

logger = logging.getLogger(__name__)

LAYOUTS = ("page_first", "layer_first", "page_first_direct")
"""The host pool layouts the backend moves."""
WARMUP_ROUNDS = 2
"""Untimed rounds first (a started daemon's L2 holds two batches: every page of it is then touched)."""
L2_BATCHES = 2
"""Batches a started daemon's L2 holds."""


@dataclass(frozen=True, slots=True)
class SglangBenchConfig:
    """What to measure.

    Attributes:
        layout: the host pools' layout (``--hicache-mem-layout``).
        pages: pages per call (SGLang's controller sends at most 128).
        page_tokens: tokens per page (``--page-size``).
        layers, kv_heads, head_dim: the model's KV geometry (bfloat16).
        rounds: timed rounds.
        data_plane: the backend's ``data_plane`` option.
    """

    layout: str = "page_first"
    pages: int = 32
    page_tokens: int = 64
    layers: int = 16
    kv_heads: int = 4
    head_dim: int = 128
    rounds: int = 5
    data_plane: DataPlaneMode = DataPlaneMode.AUTO

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        for name in ("pages", "page_tokens", "layers", "kv_heads", "head_dim", "rounds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def shape(self) -> PoolShape:
        """The host pools' geometry (each pool holds twice the batch, as the device pool it mirrors)."""
        return PoolShape(
            page=self.page_tokens,
            layers=self.layers,
            heads=self.kv_heads,
            head_dim=self.head_dim,
            device_tokens=self.pages * self.page_tokens,
        )

    @property
    def page_bytes(self) -> int:
        """Bytes of one page."""
        return 2 * self.page_tokens * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True, slots=True)
class SglangReport:
    """The figures.

    Attributes:
        config: what was measured.
        data_plane: the medium the backend moved the pages through.
        batch_bytes: bytes of one call's pages.
        set_gbps, get_gbps: ``batch_set_v1`` / ``batch_get_v1`` GB/s over the rounds.
        memcpy_gbps: the memcpy passes' GB/s.
        set_vs_memcpy, get_vs_memcpy: per-round ratios to the memcpy pass right before each call.
        exists_ms: ``batch_exists`` of the batch, milliseconds.
        verified: every load was complete and bit-exact.
    """

    config: SglangBenchConfig
    data_plane: str
    batch_bytes: int
    set_gbps: Spread
    get_gbps: Spread
    memcpy_gbps: Spread
    set_vs_memcpy: RatioSpread
    get_vs_memcpy: RatioSpread
    exists_ms: Spread
    verified: bool


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


def measure_sglang(address: str, token: str | None, config: SglangBenchConfig) -> SglangReport:
    """Measure ``config`` against the daemon at ``address``.

    Raises:
        RuntimeError: a store failed, or a load did not bring every page back.
    """
    # a generous call deadline: a slow call would be a failed round here, not a figure
    extra: dict[str, object] = {"address": address, "data_plane": config.data_plane.value, "timeout_s": 30}
    if token:
        extra["token"] = token
    pools = [host_pool(config.layout, config.shape) for _ in range(2)]
    writer, reader = (attach(p, storage_config(extra, config.layout, model="bench/sglang")) for p in pools)
    try:
        n, page = config.pages, config.page_tokens
        slots = [p.alloc(n * page) for p in pools]
        batch_bytes = n * config.page_bytes
        src = torch.empty((n, config.page_bytes), dtype=torch.uint8).random_()
        dst = torch.empty_like(src)

        def memcpy_gbps() -> float:
            return measure_memcpy(list(src), list(dst), n, 0).timing.gbps

        set_gbps: list[float] = []
        get_gbps: list[float] = []
        copy_set: list[float] = []
        copy_get: list[float] = []
        exists_ms: list[float] = []
        verified = True
        for r in range(WARMUP_ROUNDS + config.rounds):
            tokens = torch.randint(0, 32000, (n * page,), generator=torch.Generator().manual_seed(r)).tolist()
            keys = page_hashes(tokens, page)
            fill(pools[0], slots[0], seed=r)
            c_set = memcpy_gbps()
            stored, set_s = _timed(partial(writer.batch_set_v1, keys, slots[0]))
            if not all(stored):
                raise RuntimeError(f"batch_set_v1 failed in round {r}")
            hits, exists_s = _timed(partial(reader.batch_exists, keys))
            c_get = memcpy_gbps()
            loaded, get_s = _timed(partial(reader.batch_get_v1, keys, slots[1]))
            ok = hits == n and all(loaded)
            ok = ok and all(
                torch.equal(a, b) for a, b in zip(pages_of(pools[0], slots[0]), pages_of(pools[1], slots[1]))
            )
            verified = verified and ok
            if r < WARMUP_ROUNDS:
                continue
            set_gbps.append(batch_bytes / set_s / 1e9)
            get_gbps.append(batch_bytes / get_s / 1e9)
            copy_set.append(c_set)
            copy_get.append(c_get)
            exists_ms.append(exists_s * 1e3)
            logger.info(
                "round %d: set %.2f GB/s, get %.2f GB/s, memcpy %.2f GB/s",
                r,
                set_gbps[-1],
                get_gbps[-1],
                c_get,
            )
        plane = reader.data_plane().kind.name
    finally:
        writer.close()
        reader.close()
    return SglangReport(
        config=config,
        data_plane=plane,
        batch_bytes=batch_bytes,
        set_gbps=spread_of(set_gbps),
        get_gbps=spread_of(get_gbps),
        memcpy_gbps=spread_of(copy_set + copy_get),
        set_vs_memcpy=paired_ratios(set_gbps, copy_set),
        get_vs_memcpy=paired_ratios(get_gbps, copy_get),
        exists_ms=spread_of(exists_ms),
        verified=verified,
    )

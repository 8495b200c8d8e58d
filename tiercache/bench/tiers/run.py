"""The ``tiers`` benchmark run: for each chunk size and round, the machine's ceilings, then each tier.

Everything is measured in one run, size by size, on the same payload: a random bf16 payload is generated
once per size; then, ``rounds`` times, the ceilings are taken on it (memcpy; the disk and raw LMDB with L3;
raw SET/GET with the shared tier) and each tier is built for exactly one round, timed, verified and closed
(L2 unlinks its segment; L3's directory is removed). Each figure is paired with the ceilings of its own
round (see :mod:`tiercache.bench.tiers.targets`); the round with the median GB/s is the one reported. The work
directory (L3 and the disk ceilings) is a fresh temporary directory, removed at the end.

Primitives:
    TiersBenchConfig: what to measure and how.
    CeilingRow: one ceiling's median round and every round's GB/s.
    TierRow: one tier figure (its median round), every round's GB/s, and its comparisons with the ceilings.
    TiersReport: the whole run: config, machine, ceilings and rows.
    run_tiers: run the benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from tiercache.testing.redis import redis_cluster
from tiercache.tiers.base import TierLevel

from ..ceilings import CeilingResult, MachineInfo, describe_machine, measure_disk, measure_memcpy
from ..common.payload import Payload, make_destinations, make_payload
from ..common.tier_ops import TierOpResult, TierOptions, measure_tier, open_tier, tier_device
from ..common.workdir import work_directory
from .checksum_ceiling import ChecksumMethod, ChecksumRow, checksum_rows, measure_checksums
from .lmdb_ceiling import measure_lmdb_get
from .shared_ceiling import measure_redis
from .targets import Comparison, compare, median_round

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TiersBenchConfig:
    """What the ``tiers`` benchmark measures.

    Attributes:
        levels: tiers to measure, in order.
        chunk_sizes: chunk sizes in bytes, in order.
        bytes_per_size: payload bytes per chunk size (at least one chunk).
        work_root: directory under which the work directory (L3, disk ceiling) is created; None for
            :func:`~tiercache.bench.common.workdir.default_work_root`. Only the work directory created inside it
            is removed.
        options: how tiers are built and driven.
        seed: payload generator seed.
        rounds: measurement rounds per chunk size (every ceiling, then every tier, each round).
    """

    levels: tuple[TierLevel, ...] = (TierLevel.L1, TierLevel.L2, TierLevel.L3)
    chunk_sizes: tuple[int, ...] = (256 << 10, 1 << 20, 4 << 20, 16 << 20, 32 << 20)
    bytes_per_size: int = 256 << 20
    work_root: Path | None = None
    options: TierOptions = field(default_factory=TierOptions)
    seed: int = 0
    rounds: int = 3

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("levels: at least one tier is needed")
        if not self.chunk_sizes or any(s <= 0 for s in self.chunk_sizes):
            raise ValueError(f"chunk_sizes: must be positive, got {self.chunk_sizes}")
        if self.bytes_per_size <= 0:
            raise ValueError(f"bytes_per_size: must be positive, got {self.bytes_per_size}")
        if self.rounds <= 0:
            raise ValueError(f"rounds: must be positive, got {self.rounds}")
        if self.options.batch <= 0 or self.options.warmup_rounds < 0:
            raise ValueError("options: batch must be positive and warmup_rounds non-negative")

    def num_chunks(self, chunk_bytes: int) -> int:
        """Chunks moved at ``chunk_bytes``: ``bytes_per_size // chunk_bytes``, at least one."""
        return max(1, self.bytes_per_size // chunk_bytes)


@dataclass(frozen=True, slots=True)
class CeilingRow:
    """One ceiling at one chunk size over the rounds.

    Attributes:
        ceiling: its median round (the one reported).
        round_gbps: every round's GB/s, in round order.
    """

    ceiling: CeilingResult
    round_gbps: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TierRow:
    """One tier figure over the rounds and how it compares with the ceilings.

    Attributes:
        result: the figure's median round (the one reported).
        comparisons: one per ceiling it is compared against, round by round.
        round_gbps: every round's GB/s, in round order.
    """

    result: TierOpResult
    comparisons: tuple[Comparison, ...]
    round_gbps: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TiersReport:
    """The outcome of one ``tiers`` run.

    Attributes:
        config: what was asked for.
        machine: what it ran on.
        ceilings: every ceiling (its median round), by chunk size.
        rows: every tier figure, by chunk size, tier and op.
        elapsed_s: wall time of the whole run.
        checksums: what checked bytes cost next to memcpy, by chunk size and method (see
            :mod:`tiercache.bench.tiers.checksum_ceiling`).
    """

    config: TiersBenchConfig
    machine: MachineInfo
    ceilings: tuple[CeilingRow, ...]
    rows: tuple[TierRow, ...]
    elapsed_s: float
    checksums: tuple[ChecksumRow, ...] = ()


def _measure_ceilings(
    config: TiersBenchConfig,
    payloads: dict[torch.device, Payload],
    dsts: dict[torch.device, torch.Tensor],
    work: Path,
) -> list[CeilingResult]:
    """One pass of every ceiling the measured tiers are compared against."""
    opts = config.options
    cpu = torch.device("cpu")
    ceilings = [
        measure_memcpy(p.chunks(), list(dsts[d].unbind(0)), opts.batch, opts.warmup_rounds)
        for d, p in payloads.items()
    ]
    if TierLevel.L3 in config.levels:
        srcs, outs = payloads[cpu].chunks(), list(dsts[cpu].unbind(0))
        ceilings.extend(measure_disk(srcs, outs, work, opts.batch))
        ceilings.append(measure_lmdb_get(srcs, outs, work, opts.batch, opts.warmup_rounds))
    if TierLevel.SHARED in config.levels:
        ceilings.extend(
            measure_redis(opts.shared_url, payloads[cpu].chunks(), opts.batch, opts.warmup_rounds)
        )
    return ceilings


def _measure_tiers(
    config: TiersBenchConfig,
    payloads: dict[torch.device, Payload],
    dsts: dict[torch.device, torch.Tensor],
    work: Path,
) -> list[TierOpResult]:
    """One round of every tier: built for the round, put, get, verified, closed."""
    opts = config.options
    out: list[TierOpResult] = []
    for level in config.levels:
        device = tier_device(level, opts)
        payload = payloads[device]
        l3_dir = work / f"l3-{payload.chunk_bytes}"
        tier = open_tier(level, opts, payload.chunk_bytes, payload.num_chunks, l3_dir)
        try:
            results = measure_tier(tier, payload, dsts[device], opts)
        finally:
            tier.close()
            shutil.rmtree(l3_dir, ignore_errors=True)
        out.extend(results)
        logger.info(
            "%s %d KiB: put %.2f GB/s, get %.2f GB/s",
            level.name,
            payload.chunk_bytes >> 10,
            results[0].timing.gbps,
            results[1].timing.gbps,
        )
    return out


def _measure_size(
    config: TiersBenchConfig, chunk_bytes: int, work: Path
) -> tuple[list[CeilingRow], list[TierRow], list[ChecksumRow]]:
    opts = config.options
    payload = make_payload(chunk_bytes, config.num_chunks(chunk_bytes), config.seed)
    devices = list(dict.fromkeys([torch.device("cpu")] + [tier_device(lv, opts) for lv in config.levels]))
    payloads: dict[torch.device, Payload] = {d: payload.to(d) for d in devices}
    dsts = {d: make_destinations(payload, d) for d in devices}
    ceiling_rounds: list[list[CeilingResult]] = []
    result_rounds: list[list[TierOpResult]] = []
    checksum_rounds: list[dict[ChecksumMethod, float]] = []
    cpu = torch.device("cpu")
    for i in range(config.rounds):
        logger.info("chunk size %d KiB: round %d of %d", chunk_bytes >> 10, i + 1, config.rounds)
        ceiling_rounds.append(_measure_ceilings(config, payloads, dsts, work))
        checksum_rounds.append(measure_checksums(payloads[cpu].chunks(), list(dsts[cpu].unbind(0))))
        result_rounds.append(_measure_tiers(config, payloads, dsts, work))
    ceilings = []
    for j in range(len(ceiling_rounds[0])):
        per_round = [cs[j] for cs in ceiling_rounds]
        gbps = tuple(c.timing.gbps for c in per_round)
        ceilings.append(CeilingRow(per_round[median_round(gbps)], gbps))
    rows = []
    for j in range(len(result_rounds[0])):
        per_result = [rs[j] for rs in result_rounds]
        gbps = tuple(r.timing.gbps for r in per_result)
        rows.append(TierRow(per_result[median_round(gbps)], compare(per_result, ceiling_rounds), gbps))
    return ceilings, rows, checksum_rows(chunk_bytes, checksum_rounds)


@contextlib.contextmanager
def shared_store(config: TiersBenchConfig, work: Path) -> Iterator[TiersBenchConfig]:
    """The config with a shared store to measure on: the given one, or a private three-master Redis
    Cluster on loopback ports (started in ``work``, stopped at exit) when SHARED is measured without one."""
    if TierLevel.SHARED not in config.levels or config.options.shared_url:
        yield config
        return
    maxmemory = f"{max(1 << 30, 4 * config.bytes_per_size) >> 20}mb"
    with redis_cluster(work / "redis", maxmemory=maxmemory) as cluster:
        logger.info("started a Redis Cluster %s (3 masters) for the shared tier", cluster.version)
        yield replace(config, options=replace(config.options, shared_url=cluster.url))


def run_tiers(config: TiersBenchConfig) -> TiersReport:
    """Measure the ceilings and the tiers at every chunk size; see the module docstring.

    Raises:
        RoundTripError: a tier lost or changed bytes.
        TierCacheError: a tier refused the configuration (e.g. no such device).
        OSError: the work directory, shared memory or disk ceiling failed.
    """
    start = time.perf_counter()
    ceilings: list[CeilingRow] = []
    rows: list[TierRow] = []
    checksums: list[ChecksumRow] = []
    with work_directory(config.work_root) as work, shared_store(config, work) as config:
        machine = describe_machine(torch.device(config.options.l1_device), work)
        for chunk_bytes in config.chunk_sizes:
            logger.info(
                "chunk size %d KiB: %d chunks, batch %d, %d rounds",
                chunk_bytes >> 10,
                config.num_chunks(chunk_bytes),
                config.options.batch,
                config.rounds,
            )
            size_ceilings, size_rows, size_checksums = _measure_size(config, chunk_bytes, work)
            ceilings.extend(size_ceilings)
            rows.extend(size_rows)
            checksums.extend(size_checksums)
    elapsed = time.perf_counter() - start
    return TiersReport(config, machine, tuple(ceilings), tuple(rows), elapsed, tuple(checksums))

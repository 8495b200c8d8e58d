"""The ``connector`` benchmark: store/load through the connector against the machine and bare gRPC.

For each layout case (a model-like KV layout at a chunk size) the bench, in one run and on one daemon:

1. measures memcpy of the same bytes in chunk-size copies (the same-host ceiling), once more right before
   every timed round: each round's ratio is to its own memcpy pass, and the median ratio is kept with its
   spread (:mod:`tiercache.bench.common.spread`);
2. stores then loads ``rounds`` prompts through :class:`~tiercache.connector.KVConnector` with per-layer
   :class:`~tiercache.connector.ContiguousKV` engine tensors over the shared-memory data plane, verifying
   that every loaded byte equals the stored one (a mismatch is an error, never a figure); the namespace is
   purged after each round so that no round evicts another;
3. times ``Lookup`` of the stored chain against ``Diagnostics.Echo`` of a message of the same size, over
   the transport the lookup took (the daemon's control socket when it has one, else gRPC);
4. stores and loads through the byte stream (``ConnectorConfig(data_plane=DataPlaneMode.STREAM)``), verified the same
   way, against the bare one-way streams ``Diagnostics.SinkStream`` / ``SourceStream`` of the same bytes in
   messages of the path's own piece size (a store against the stream to the daemon, a load against the
   stream from it), both measured right before every timed round and paired with it like memcpy (a bare
   stream from the daemon measured once ranged from 0.23 to 0.60 GB/s over ten runs on a busy 2-core host,
   more than the figures it divides).

Targets (issue 3): same-host load/store >= 0.8x memcpy; lookup p50 <= 2x bare echo p50; byte stream
>= 0.8x the bare stream, each throughput target judged by its median per-round ratio. With CUDA (issue 13): loads from L2 into device tensors >= 0.8x the device's
pinned host-to-device copy of the same bytes (:mod:`.h2d`).

The KV layouts measured are :class:`~tiercache.bench.common.layout_cases.LayoutCase` values.

Primitives:
    ConnectorBenchConfig: what to measure.
    ConnectorFigure: one figure next to its baseline, ratio and target (:mod:`.figure`).
    ConnectorReport: the whole run.
    BenchError: the daemon refused or lost data (not a corruption: e.g. no room, no data plane).
    run_connector: run the benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from tiercache.connector import (
    ClientConfig,
    ConnectorConfig,
    ContiguousKV,
    DataPlaneMode,
    KVConnector,
    TierCacheClient,
)
from tiercache.connector.stream import message_limit, piece_bytes
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout
from tiercache.testing.embedded import DaemonHandle, EmbeddedDaemonConfig, use_daemon

from ..ceilings import CeilingKind, CeilingResult, MachineInfo, describe_machine, measure_memcpy
from ..common.kvcheck import distinct_prompts, make_contiguous_kv, verify_kv, zero_kv, zeros_like_kv
from ..common.layout_cases import LayoutCase
from ..common.payload import make_destinations, make_payload
from ..common.progress import ProgressBar
from ..common.spread import paired_ratios
from ..common.timing import summarize, time_latency
from ..common.workdir import work_directory
from .baselines import DiagnosticsProbe
from .figure import (
    LOOKUP_TARGET,
    STORE_LOAD_TARGET,
    STREAM_TARGET,
    BenchError,
    ConnectorFigure,
)
from .figure import throughput_figure as _figure
from .h2d import cuda_device, measure_h2d

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectorBenchConfig:
    """What the ``connector`` benchmark measures.

    Attributes:
        cases: layouts at chunk sizes, in order.
        bytes_per_case: KV bytes per round (at least one chunk; capped by the daemon's free L2 slots).
        rounds: timed store/load rounds per path (plus one untimed warm-up round).
        lookup_calls: timed Lookup and Echo calls.
        stream: also measure the byte-stream path.
        address: a running daemon, or None to start one per chunk size.
        token: its bearer token.
        daemon: sizes of a started daemon (its slot size is set to each case's chunk size).
        work_root: where the run's work directory is created.
        seed: KV and prompt seed.
    """

    cases: tuple[LayoutCase, ...]
    bytes_per_case: int = 256 << 20
    rounds: int = 3
    lookup_calls: int = 300
    stream: bool = True
    address: str | None = None
    token: str | None = None
    daemon: EmbeddedDaemonConfig = field(default_factory=EmbeddedDaemonConfig)
    work_root: Path | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.cases:
            raise ValueError("cases: at least one layout is needed")
        if self.bytes_per_case <= 0 or self.rounds <= 0 or self.lookup_calls <= 0:
            raise ValueError("bytes_per_case, rounds and lookup_calls must be positive")


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """The daemon(s) a run used.

    Attributes:
        address: the address dialled (of the last daemon for embedded runs).
        embedded: started by the bench.
        argv: embedded daemons' command lines.
    """

    address: str
    embedded: bool
    argv: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectorReport:
    """The outcome of one ``connector`` run.

    Attributes:
        config: what was asked for.
        machine: what it ran on.
        daemon: the daemon(s) used.
        ceilings: per case (its label first): memcpy and, with the stream, the bare one-way streams.
        figures: every connector figure.
        elapsed_s: wall time.
    """

    config: ConnectorBenchConfig
    machine: MachineInfo
    daemon: DaemonInfo
    ceilings: tuple[tuple[str, CeilingResult], ...]
    figures: tuple[ConnectorFigure, ...]
    elapsed_s: float


@dataclass(slots=True)
class _Rounds:
    """Durations and verified bytes of the timed rounds of one path, and the ceilings (GB/s) of the store
    and of the load measured right before each round."""

    store_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    verified: int = 0
    store_ceiling_gbps: list[float] = field(default_factory=list)
    load_ceiling_gbps: list[float] = field(default_factory=list)


_Ceilings = Callable[[], tuple[float, float]]
"""Measures a path's ceilings now: GB/s of the store's and of the load's."""


def _timed(call: Callable[[], object]) -> tuple[object, float]:
    t0 = time.perf_counter()
    result = call()
    return result, time.perf_counter() - t0


def _round(
    conn: KVConnector,
    prompt: np.ndarray,
    src: ContiguousKV,
    dst: ContiguousKV,
    out: _Rounds | None,
    on_done: Callable[[], object],
) -> None:
    """Store then load one prompt, verify, purge; record durations in ``out`` (None: warm-up)."""
    tokens = len(prompt)
    stored, store_s = _timed(lambda: conn.store(prompt, src))
    if stored.tokens_stored != tokens:  # type: ignore[attr-defined]
        raise BenchError(f"the daemon stored {stored} of {tokens} tokens (too little room? see its log)")
    zero_kv(dst)
    loaded, load_s = _timed(lambda: conn.load(prompt, dst))
    if loaded.tokens_loaded != tokens:  # type: ignore[attr-defined]
        raise BenchError(f"the daemon loaded {loaded} of {tokens} tokens")
    verified = verify_kv(src, dst, tokens, conn.namespace.layout.mla)
    conn.client.purge(conn.namespace)
    on_done()
    if out is not None:
        out.store_s.append(store_s)
        out.load_s.append(load_s)
        out.verified += verified


def _run_path(
    conn: KVConnector,
    prompts: Sequence[np.ndarray],
    src: ContiguousKV,
    dst: ContiguousKV,
    bar: ProgressBar,
    ceilings: _Ceilings,
) -> _Rounds:
    """One warm-up round, then a timed round per further prompt, ``ceilings`` measured right before each."""
    rounds = _Rounds()
    _round(conn, prompts[0], src, dst, None, bar.advance)
    for prompt in prompts[1:]:
        store_gbps, load_gbps = ceilings()
        rounds.store_ceiling_gbps.append(store_gbps)
        rounds.load_ceiling_gbps.append(load_gbps)
        _round(conn, prompt, src, dst, rounds, bar.advance)
    return rounds


def _memcpy_gbps(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor]) -> tuple[float, float]:
    gbps = measure_memcpy(srcs, dsts, 1, 0).timing.gbps
    return gbps, gbps


def _gbps(nbytes: int, durations: Sequence[float]) -> list[float]:
    return [nbytes / s / 1e9 for s in durations]


def _per_round(
    kind: CeilingKind, device: str, chunk_bytes: int, nbytes: int, gbps: Sequence[float], note: str
) -> CeilingResult:
    """A ceiling of ``nbytes`` measured once per round (``gbps``): all passes together, their range noted."""
    seconds = [nbytes / g / 1e9 for g in gbps]
    timing = summarize(nbytes * len(gbps), sum(seconds), seconds)
    where = f"{len(gbps)} passes, one right before each timed round ({min(gbps):.2f}-{max(gbps):.2f} GB/s)"
    return CeilingResult(kind, device, chunk_bytes, timing, f"{where}; {note}" if note else where)


def _chunks_for(
    case: LayoutCase, config: ConnectorBenchConfig, client: TierCacheClient, ns: Namespace
) -> int:
    reg = client.register(ns)
    if reg.segment is None or client.slot_mapping(ns) is None:
        raise BenchError(
            "the daemon's shared memory is not reachable from here (another host, or no L2): "
            "the same-host path cannot be measured"
        )
    wanted = max(1, config.bytes_per_case // reg.chunk_bytes)
    room = max(1, reg.segment.num_slots * reg.segment.slot_bytes // reg.chunk_bytes - 1)  # slots are pages
    if wanted > room:
        logger.warning(
            "%s: %d chunks per round do not fit the daemon's L2; using %d", case.label, wanted, room
        )
    return int(min(wanted, room))


def _measure_case(
    case: LayoutCase, config: ConnectorBenchConfig, handle: DaemonHandle, bar: ProgressBar
) -> tuple[list[CeilingResult], list[ConnectorFigure]]:
    layout = case.layout()
    ns = Namespace(f"tiercache-bench/{case.name}", f"run-{secrets.token_hex(4)}", layout)
    client_config = ClientConfig(timeout_s=60.0, stream_timeout_s=600.0, engine_id="tiercache-bench")
    client = TierCacheClient.connect(handle.address, handle.token, config=client_config)
    probe = DiagnosticsProbe(handle.address, handle.token)
    try:
        chunks = _chunks_for(case, config, client, ns)
        tokens = chunks * layout.chunk_tokens
        total = chunks * layout.chunk_bytes
        payload = make_payload(layout.chunk_bytes, chunks, config.seed)
        copy_srcs = payload.chunks()
        copy_dsts = list(make_destinations(payload, payload.device).unbind(0))
        memcpy = measure_memcpy(copy_srcs, copy_dsts, 1, 1)
        src = make_contiguous_kv(layout, tokens, config.seed)
        dst = zeros_like_kv(src)
        prompts = distinct_prompts(config.rounds + 1, tokens, config.seed)
        shm = _run_path(
            KVConnector(client, ns), prompts, src, dst, bar, partial(_memcpy_gbps, copy_srcs, copy_dsts)
        )
        del payload, copy_srcs, copy_dsts
        passes = shm.load_ceiling_gbps
        memcpy = _per_round(memcpy.kind, memcpy.device, memcpy.chunk_bytes, total, passes, memcpy.note)
        base = memcpy.timing.gbps
        store_spread = paired_ratios(_gbps(total, shm.store_s), passes)
        load_spread = paired_ratios(_gbps(total, shm.load_s), passes)
        figures = [
            _figure(case, layout, chunks, "shm", "store", summarize(total * config.rounds, sum(shm.store_s), shm.store_s), memcpy.label, base, STORE_LOAD_TARGET, spread=store_spread),
            _figure(case, layout, chunks, "shm", "load", summarize(total * config.rounds, sum(shm.load_s), shm.load_s), memcpy.label, base, STORE_LOAD_TARGET, shm.verified, load_spread),
        ]  # fmt: skip
        figures.append(_lookup_figure(case, layout, chunks, config, client, probe, ns, prompts[-1], src))
        bar.advance()
        ceilings = [memcpy]
        if config.stream:
            store_piece, load_piece = _stream_pieces(client, ns, layout.chunk_bytes)
            remote = KVConnector(client, ns, ConnectorConfig(DataPlaneMode.STREAM))
            stream_prompts = distinct_prompts(config.rounds + 1, tokens, config.seed + 1)
            bare = partial(_bare_streams_gbps, probe, store_piece, load_piece, total)
            st = _run_path(remote, stream_prompts, src, dst, bar, bare)
            sink = _per_round(
                CeilingKind.STREAM_SINK,
                "grpc",
                layout.chunk_bytes,
                total,
                st.store_ceiling_gbps,
                f"one way to the daemon, {store_piece}-byte messages",
            )
            source = _per_round(
                CeilingKind.STREAM_SOURCE,
                "grpc",
                layout.chunk_bytes,
                total,
                st.load_ceiling_gbps,
                f"one way from the daemon, {load_piece}-byte messages",
            )
            ceilings += [sink, source]
            store_spread = paired_ratios(_gbps(total, st.store_s), st.store_ceiling_gbps)
            load_spread = paired_ratios(_gbps(total, st.load_s), st.load_ceiling_gbps)
            figures += [
                _figure(case, layout, chunks, "stream", "store", summarize(total * config.rounds, sum(st.store_s), st.store_s), sink.label, sink.timing.gbps, STREAM_TARGET, spread=store_spread),
                _figure(case, layout, chunks, "stream", "load", summarize(total * config.rounds, sum(st.load_s), st.load_s), source.label, source.timing.gbps, STREAM_TARGET, st.verified, load_spread),
            ]  # fmt: skip
        device = cuda_device()
        if device is not None:
            gpu_prompts = distinct_prompts(config.rounds + 1, tokens, config.seed + 2)
            ceiling, gpu = measure_h2d(case, KVConnector(client, ns), gpu_prompts, src, device)
            ceilings.append(ceiling)
            figures.append(gpu)
        return ceilings, figures
    finally:
        probe.close()
        client.close()


def _stream_pieces(client: TierCacheClient, ns: Namespace, chunk_bytes: int) -> tuple[int, int]:
    """The data bytes a byte-stream store piece / load piece carries (a chunk, or the largest piece when a
    chunk needs several): the message size of the bare streams it is compared with."""
    limit = message_limit(
        client.registration(ns).max_stream_message_bytes, client.config.channel.max_message_bytes
    )
    return min(chunk_bytes, piece_bytes(limit)), min(chunk_bytes, limit)  # the daemon sends up to limit


def _bare_streams_gbps(
    probe: DiagnosticsProbe, store_piece: int, load_piece: int, total: int
) -> tuple[float, float]:
    """GB/s of the one-way bare streams of ``total`` bytes: to the daemon in store-piece messages, and from
    it in load-piece messages (each after a few untimed messages)."""
    return probe.sink_timing(store_piece, total).gbps, probe.source_timing(load_piece, total).gbps


def _lookup_figure(
    case: LayoutCase,
    layout: KVLayout,
    chunks: int,
    config: ConnectorBenchConfig,
    client: TierCacheClient,
    probe: DiagnosticsProbe,
    ns: Namespace,
    prompt: np.ndarray,
    src: ContiguousKV,
) -> ConnectorFigure:
    """Lookup latency of a stored chain (stored again for the purpose) vs Echo of a same-size message."""
    conn = KVConnector(client, ns)
    conn.store(prompt, src)
    keys = chunk_keys(ns, prompt)

    def lookup() -> None:
        info = client.lookup(ns, keys)
        if info.chunks != len(keys):
            raise BenchError(f"lookup found {info.chunks} of {len(keys)} stored chunks")

    latency = time_latency(lookup, config.lookup_calls, warmup=10)
    control = client.registration(ns).control_socket  # the lookup went there: so does its echo
    if control:
        echo = probe.control_echo_latency(control, b"".join(keys), config.lookup_calls, warmup=10)
    else:
        echo = probe.echo_latency(b"".join(keys), config.lookup_calls, warmup=10)
    client.purge(ns)
    ratio = latency.p50_s / echo.p50_s
    return ConnectorFigure(
        case.label,
        layout.chunk_bytes,
        chunks,
        "rpc",
        "lookup",
        "ms",
        latency.p50_ms,
        "echo (control socket)" if control else "echo",
        echo.p50_ms,
        ratio,
        LOOKUP_TARGET,
        True,
        ratio <= LOOKUP_TARGET,
        latency=latency,
        baseline_latency=echo,
    )


@contextlib.contextmanager
def _daemon_for(
    config: ConnectorBenchConfig, chunk_bytes: int, work: Path, started: list[tuple[str, ...]]
) -> Iterator[DaemonHandle]:
    daemon = config.daemon
    if config.address is None:
        l2 = max(2, daemon.l2_bytes // chunk_bytes) * chunk_bytes
        daemon = EmbeddedDaemonConfig(
            slot_bytes=chunk_bytes,
            l1_device=daemon.l1_device,
            l1_bytes=daemon.l1_bytes,
            l2_bytes=l2,
            l3_bytes=daemon.l3_bytes,
            write_policy=daemon.write_policy,
            eviction_policy=daemon.eviction_policy,
            max_message_bytes=daemon.max_message_bytes,
        )
    sub = work / f"daemon-{chunk_bytes}"
    sub.mkdir(exist_ok=True)
    with use_daemon(config.address, config.token, daemon, sub) as handle:
        if handle.embedded:
            started.append(handle.argv)
        yield handle


def run_connector(config: ConnectorBenchConfig, progress: bool = False) -> ConnectorReport:
    """Measure every case; see the module docstring.

    Raises:
        RoundTripError: loaded KV differs from the stored KV.
        BenchError: the daemon refused or lost data.
        DaemonStartError: an embedded daemon did not start.
        TierCacheError: a daemon call failed.
    """
    start = time.perf_counter()
    ceilings: list[tuple[str, CeilingResult]] = []
    figures: list[ConnectorFigure] = []
    started: list[tuple[str, ...]] = []
    address = config.address or ""
    steps_per_case = (config.rounds + 1) * (2 if config.stream else 1) + 1
    by_size: dict[int, list[LayoutCase]] = {}
    for case in config.cases:
        by_size.setdefault(case.layout().chunk_bytes, []).append(case)
    with (
        work_directory(config.work_root) as work,
        ProgressBar(steps_per_case * len(config.cases), "connector", progress) as bar,
    ):
        machine = describe_machine(torch.device("cpu"), work)
        for chunk_bytes, cases in by_size.items():
            with _daemon_for(config, chunk_bytes, work, started) as handle:
                address = handle.address
                for case in cases:
                    logger.info("%s: %d-byte chunks", case.label, chunk_bytes)
                    c, f = _measure_case(case, config, handle, bar)
                    ceilings += [(case.label, x) for x in c]
                    figures += f
    daemon = DaemonInfo(address, config.address is None, tuple(started))
    order = {case.label: i for i, case in enumerate(config.cases)}
    figures.sort(key=lambda f: order[f.case])
    return ConnectorReport(
        config, machine, daemon, tuple(ceilings), tuple(figures), time.perf_counter() - start
    )

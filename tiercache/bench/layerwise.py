"""``layerwise``: the overlap of layerwise loading with the engine's per-layer compute, as a measured timeline.

A prompt's KV is stored through a real daemon (``--address``, or one started for the run), then loaded back
three ways while a synthetic "compute" runs per layer — a real ``torch`` matmul workload sized (calibrated
at the start) so that computing one layer takes about as long as copying one layer:

* compute only: the per-layer compute with nothing to load (the floor);
* load, then compute: ``KVConnector.load`` of every layer, then layer 0's compute, layer 1's, ...;
* layerwise: ``KVConnector.load_layerwise``, then for each layer ``wait_layer(l)`` and its compute, while
  the connector's worker thread copies the next layers.

The report gives the total times (median of ``--repeats``) and, for one layerwise run, each layer's copy and
compute intervals in milliseconds from the start. Compute runs with ``--threads`` torch threads (default 1)
so that the copy thread has a core of its own.

Primitives:
    configure_parser, run: the subcommand's CLI.
    LayerwiseBenchConfig: sizes and repetitions.
    LayerTimes, LayerwiseReport: the measurements.
    measure_layerwise: run the measurement against a daemon address.
    format_layerwise: the plain-text report.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tiercache.connector import ClientConfig, ContiguousKV, KVConnector, LoadPolicy, TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon

from .tables import columns, format_size

logger = logging.getLogger(__name__)

_MATMUL_N = 256
"""Side of the square float32 matrices of the synthetic compute."""


@dataclass(frozen=True, slots=True)
class LayerwiseBenchConfig:
    """What to measure.

    Attributes:
        layers: model layers.
        chunks: full chunks in the prompt.
        chunk_tokens: tokens per chunk.
        kv_heads: KV heads.
        head_dim: head dimension.
        repeats: runs of each mode (the median total is reported).
        threads: torch threads of the synthetic compute.
    """

    layers: int = 16
    chunks: int = 24
    chunk_tokens: int = 128
    kv_heads: int = 8
    head_dim: int = 128
    repeats: int = 5
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("layers", "chunks", "chunk_tokens", "kv_heads", "head_dim", "repeats", "threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def layout(self) -> KVLayout:
        """The bf16 layout of the run."""
        return KVLayout(
            self.layers,
            self.kv_heads,
            self.head_dim,
            KVDtype.BFLOAT16,
            chunk_tokens=self.chunk_tokens,
            page_tokens=self.chunk_tokens,
        )


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One layer of the layerwise run, milliseconds from the start of the load.

    Attributes:
        layer: the layer.
        copy_start_ms, copy_end_ms: when the connector's worker copied the layer of every chunk.
        wait_end_ms: when ``wait_layer`` returned.
        compute_start_ms, compute_end_ms: the layer's synthetic compute.
    """

    layer: int
    copy_start_ms: float
    copy_end_ms: float
    wait_end_ms: float
    compute_start_ms: float
    compute_end_ms: float


@dataclass(frozen=True, slots=True)
class LayerwiseReport:
    """The measurements.

    Attributes:
        config: what was measured.
        chunk_bytes: bytes of one chunk.
        tokens: tokens loaded (every run loads all of them).
        copy_ms_per_layer: measured copy time of one layer of every chunk (calibration).
        compute_ms_per_layer: measured synthetic compute of one layer.
        compute_only_ms: total of the compute alone (median).
        load_then_compute_ms: total of load-all-then-compute (median).
        load_ms: of which the load (median).
        layerwise_ms: total of the layerwise run (median).
        overlap_saved_ms: ``load_then_compute_ms - layerwise_ms``.
        timeline: per layer, the layerwise run whose total was the median.
    """

    config: LayerwiseBenchConfig
    chunk_bytes: int
    tokens: int
    copy_ms_per_layer: float
    compute_ms_per_layer: float
    compute_only_ms: float
    load_then_compute_ms: float
    load_ms: float
    layerwise_ms: float
    overlap_saved_ms: float
    timeline: tuple[LayerTimes, ...]


class _Compute:
    """A synthetic per-layer compute: ``iters`` float32 matmuls of ``_MATMUL_N`` squared."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self._a = torch.randn(_MATMUL_N, _MATMUL_N, generator=gen)
        self._b = torch.randn(_MATMUL_N, _MATMUL_N, generator=gen)
        self._out = torch.empty(_MATMUL_N, _MATMUL_N)
        self.iters = 1

    def calibrate(self, target_s: float) -> None:
        """Choose ``iters`` so that one layer takes about ``target_s``."""
        self.iters = 20
        self.layer()  # warm-up
        started = time.perf_counter()
        self.layer()
        per = (time.perf_counter() - started) / self.iters
        self.iters = max(1, round(target_s / per))

    def layer(self) -> None:
        for _ in range(self.iters):
            torch.mm(self._a, self._b, out=self._out)


def _ms(t: float, t0: float) -> float:
    return round((t - t0) * 1e3, 3)


def measure_layerwise(
    address: str, config: LayerwiseBenchConfig, token: str | None = None
) -> LayerwiseReport:
    """Store a prompt, then time the three modes against the daemon at ``address``.

    Raises:
        RuntimeError: a load did not bring the whole prompt back (the daemon lacks room or failed).
    """
    torch.set_num_threads(config.threads)
    layout = config.layout
    ns = Namespace(
        model_id="bench/layerwise", revision=str(time.time_ns()), layout=layout, tokenizer_id="bench"
    )
    client = TierCacheClient.connect(address, token=token, config=ClientConfig(timeout_s=30.0))
    conn = KVConnector(client, ns)
    n = config.chunks * config.chunk_tokens
    tokens = list(range(n))
    shape = (2, n, config.kv_heads, config.head_dim)
    gen = torch.Generator().manual_seed(1)
    source = ContiguousKV(
        [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(config.layers)]
    )
    kv = ContiguousKV([torch.zeros(shape, dtype=torch.bfloat16) for _ in range(config.layers)])
    try:
        if conn.store(tokens, source).tokens_stored != n:
            raise RuntimeError("the daemon did not store the prompt (no room?)")
        if conn.load(tokens, kv).tokens_loaded != n:  # warm-up: fault in the pages
            raise RuntimeError("the daemon did not load the prompt back")
        copies = []
        for _ in range(config.repeats):
            with conn.load_layerwise(tokens, kv, LoadPolicy.best_effort()) as load:
                load.result()
                copies += [end - start for start, end in load.timeline]
        copy_s = statistics.median(copies)
        compute = _Compute()
        compute.calibrate(copy_s)
        compute_only, serial, serial_load, layerwise = [], [], [], []
        timelines: list[tuple[float, tuple[LayerTimes, ...]]] = []
        per_layer = []
        for _ in range(config.repeats):
            t0 = time.perf_counter()
            for _layer in range(config.layers):
                started = time.perf_counter()
                compute.layer()
                per_layer.append(time.perf_counter() - started)
            compute_only.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            if conn.load(tokens, kv, LoadPolicy.best_effort()).tokens_loaded != n:
                raise RuntimeError("a load did not bring the whole prompt back")
            serial_load.append(time.perf_counter() - t0)
            for _layer in range(config.layers):
                compute.layer()
            serial.append(time.perf_counter() - t0)

            total, timeline = _layerwise_run(conn, tokens, kv, compute, config.layers, n)
            layerwise.append(total)
            timelines.append((total, timeline))
    finally:
        client.close()
    median_total = statistics.median(layerwise)
    timeline = min(timelines, key=lambda item: abs(item[0] - median_total))[1]
    ms = 1e3
    return LayerwiseReport(
        config=config,
        chunk_bytes=layout.chunk_bytes,
        tokens=n,
        copy_ms_per_layer=round(copy_s * ms, 3),
        compute_ms_per_layer=round(statistics.median(per_layer) * ms, 3),
        compute_only_ms=round(statistics.median(compute_only) * ms, 3),
        load_then_compute_ms=round(statistics.median(serial) * ms, 3),
        load_ms=round(statistics.median(serial_load) * ms, 3),
        layerwise_ms=round(median_total * ms, 3),
        overlap_saved_ms=round((statistics.median(serial) - median_total) * ms, 3),
        timeline=timeline,
    )


def _layerwise_run(
    conn: KVConnector, tokens: list[int], kv: ContiguousKV, compute: _Compute, layers: int, n: int
) -> tuple[float, tuple[LayerTimes, ...]]:
    t0 = time.perf_counter()
    marks = []
    with conn.load_layerwise(tokens, kv, LoadPolicy.best_effort()) as load:
        for layer in range(layers):
            if load.wait_layer(layer) != n:
                raise RuntimeError(f"layer {layer} did not arrive")
            waited = time.perf_counter()
            compute.layer()
            marks.append((waited, time.perf_counter()))
        total = time.perf_counter() - t0
        copies = load.timeline
    rows = tuple(
        LayerTimes(layer, _ms(cs, t0), _ms(ce, t0), _ms(w, t0), _ms(w, t0), _ms(e, t0))
        for layer, ((cs, ce), (w, e)) in enumerate(zip(copies, marks, strict=True))
    )
    return total, rows


def format_layerwise(report: LayerwiseReport) -> str:
    """The plain-text report: totals, then the layerwise timeline."""
    c = report.config
    head = (
        f"layerwise load vs load-then-compute: {c.layers} layers x {c.chunks} chunks of "
        f"{format_size(report.chunk_bytes)} ({report.tokens} tokens, bf16); copy {report.copy_ms_per_layer:.2f} "
        f"ms/layer, compute {report.compute_ms_per_layer:.2f} ms/layer; median of {c.repeats}"
    )
    floor = report.compute_only_ms
    totals = [
        ("compute only (floor)", floor),
        (f"load all ({report.load_ms:.1f} ms), then compute", report.load_then_compute_ms),
        ("layerwise: wait_layer(l), compute l", report.layerwise_ms),
    ]
    rows = [[name, f"{ms:.1f}", f"{ms / floor:.2f}x" if floor > 0 else "-"] for name, ms in totals]
    lines = [head, "", *columns(["mode", "total ms", "vs floor"], rows, frozenset({0}))]
    lines += [
        "",
        f"overlap saved {report.overlap_saved_ms:.1f} ms",
        "",
        "layerwise timeline (ms from the start):",
    ]
    trows = [
        [
            str(t.layer),
            f"{t.copy_start_ms:.2f}",
            f"{t.copy_end_ms:.2f}",
            f"{t.compute_start_ms:.2f}",
            f"{t.compute_end_ms:.2f}",
        ]
        for t in report.timeline
    ]
    lines += columns(["layer", "copy start", "copy end", "compute start", "compute end"], trows, frozenset())
    return "\n".join(lines)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options to ``parser``."""
    d = LayerwiseBenchConfig()
    parser.add_argument("--address", help="daemon address (default: start one for the run)")
    parser.add_argument("--token", help="bearer token of the daemon at --address")
    parser.add_argument("--layers", type=int, default=d.layers, help=f"model layers (default {d.layers})")
    parser.add_argument(
        "--chunks", type=int, default=d.chunks, help=f"chunks in the prompt (default {d.chunks})"
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=d.chunk_tokens,
        help=f"tokens per chunk (default {d.chunk_tokens})",
    )
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    parser.add_argument(
        "--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})"
    )
    parser.add_argument("--repeats", type=int, default=d.repeats, help=f"runs per mode (default {d.repeats})")
    parser.add_argument(
        "--threads", type=int, default=d.threads, help=f"torch threads of the compute (default {d.threads})"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the measurement and print the report; returns the exit status (1 when the daemon failed)."""
    try:
        config = LayerwiseBenchConfig(
            args.layers,
            args.chunks,
            args.chunk_tokens,
            args.kv_heads,
            args.head_dim,
            args.repeats,
            args.threads,
        )
    except ValueError as exc:
        print(f"layerwise: {exc}")
        return 2
    chunk_bytes = config.layout.chunk_bytes
    daemon_cfg = EmbeddedDaemonConfig(
        slot_bytes=chunk_bytes, l2_bytes=2 * config.chunks * chunk_bytes + chunk_bytes, l3_bytes=0
    )
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tcbench-layerwise-") as work,
            use_daemon(args.address, args.token, daemon_cfg, Path(work)) as daemon,
        ):
            report = measure_layerwise(daemon.address, config, daemon.token)
    except RuntimeError as exc:
        print(f"layerwise: {exc}")
        return 1
    print(format_layerwise(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0

"""``singleflight``: N identical requests arriving together on a cold cache, with and without single-flight
prefill coordination, through a real daemon (``--address``, or one started for the run).

Each request is an engine thread with its own client. "Prefill" is synthetic: computing a range of tokens
sleeps ``tokens / --prefill-tokens-per-s`` and then writes that range's (pre-generated) KV into the request's
tensors; the loads and stores are real. By default the requests share one accelerator: their prefill steps
run one at a time (``--independent-compute``: each request has its own).

* uncoordinated: every request loads (a miss on the cold cache), computes the whole prompt, then stores it;
* coordinated: every request asks for a claim (``KVConnector.prefill_claim``); the leader computes chunk by
  chunk and publishes each chunk as soon as it is computed; the followers wait (``claim.wait``), then load
  what is cached and compute what is left.

Reported per mode: prefill tokens computed in total, and per request the time from arrival until its load
returned ("first load": the cached prefix is in its tensors) and until its whole prompt KV was in place
("ready": loaded or computed — when it could start decoding).

Primitives:
    configure_parser, run: the subcommand's CLI.
    SingleFlightBenchConfig: sizes and the synthetic prefill rate.
    RequestTimes, ModeReport, SingleFlightReport: the measurements.
    measure_single_flight: run both modes against a daemon address.
    format_single_flight: the plain-text report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tiercache.connector import ClientConfig, ConnectorConfig, ContiguousKV, KVConnector, TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon

from .tables import columns

MODES = ("uncoordinated", "coordinated")


@dataclass(frozen=True, slots=True)
class SingleFlightBenchConfig:
    """What to measure.

    Attributes:
        requests: identical requests arriving together.
        chunks: full chunks in the prompt.
        chunk_tokens: tokens per chunk.
        layers, kv_heads, head_dim: the KV layout (bf16).
        prefill_tokens_per_s: rate of the synthetic prefill.
        wait_timeout_s: how long a follower waits for the leader at most.
        shared_compute: the requests' prefill steps run one at a time (one accelerator).
    """

    requests: int = 4
    chunks: int = 8
    chunk_tokens: int = 64
    layers: int = 4
    kv_heads: int = 4
    head_dim: int = 64
    prefill_tokens_per_s: float = 4000.0
    wait_timeout_s: float = 30.0
    shared_compute: bool = True

    def __post_init__(self) -> None:
        for name in ("requests", "chunks", "chunk_tokens", "layers", "kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.prefill_tokens_per_s > 0 or not self.wait_timeout_s > 0:
            raise ValueError("prefill_tokens_per_s and wait_timeout_s must be positive")

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
class RequestTimes:
    """One request.

    Attributes:
        request: its number.
        role: ``alone`` (uncoordinated), ``leader`` or ``follower``.
        waited_s: time in ``claim.wait``.
        loaded_tokens: tokens loaded from the cache.
        computed_tokens: tokens prefilled by this request.
        first_load_s: from arrival until its load returned.
        ready_s: from arrival until its whole prompt KV was in its tensors.
        exact: whether its KV equals the source bit for bit.
    """

    request: int
    role: str
    waited_s: float
    loaded_tokens: int
    computed_tokens: int
    first_load_s: float
    ready_s: float
    exact: bool


@dataclass(frozen=True, slots=True)
class ModeReport:
    """One mode.

    Attributes:
        mode: ``uncoordinated`` or ``coordinated``.
        prefill_tokens: tokens computed by all requests together.
        mean_ready_s, max_ready_s: over the requests.
        requests: per request.
    """

    mode: str
    prefill_tokens: int
    mean_ready_s: float
    max_ready_s: float
    requests: tuple[RequestTimes, ...]


@dataclass(frozen=True, slots=True)
class SingleFlightReport:
    """Both modes.

    Attributes:
        config: what was measured.
        prompt_tokens: tokens of the prompt (full chunks).
        modes: uncoordinated, then coordinated.
    """

    config: SingleFlightBenchConfig
    prompt_tokens: int
    modes: tuple[ModeReport, ...]


class _Engine:
    """One request's engine: its own client and tensors; the synthetic prefill."""

    def __init__(
        self,
        address: str,
        token: str | None,
        ns: Namespace,
        source: ContiguousKV,
        rate: float,
        accelerator: threading.Lock | None,
    ) -> None:
        self.client = TierCacheClient.connect(address, token=token, config=ClientConfig(timeout_s=60.0))
        self.conn = KVConnector(self.client, ns, ConnectorConfig(prefill_ttl_s=30.0))
        self.source = source
        self.kv = ContiguousKV([torch.zeros_like(t) for t in source.layers])
        self.rate = rate
        self.accelerator = accelerator

    def compute(self, start: int, end: int) -> None:
        """Prefill tokens ``[start, end)``: sleep for the synthetic rate, then write their KV."""
        if end <= start:
            return
        if self.accelerator is None:
            time.sleep((end - start) / self.rate)
        else:
            with self.accelerator:
                time.sleep((end - start) / self.rate)
        for dst, src in zip(self.kv.layers, self.source.layers, strict=True):
            dst[:, start:end].copy_(src[:, start:end])

    def exact(self) -> bool:
        return all(
            torch.equal(a.view(torch.int16), b.view(torch.int16))
            for a, b in zip(self.kv.layers, self.source.layers, strict=True)
        )


def _uncoordinated(
    engine: _Engine, tokens: list[int], request: int, t0: float, timeout: float
) -> RequestTimes:
    loaded = engine.conn.load(tokens, engine.kv).tokens_loaded
    first = time.perf_counter() - t0
    engine.compute(loaded, len(tokens))
    ready = time.perf_counter() - t0
    engine.conn.store(tokens, engine.kv)
    return RequestTimes(request, "alone", 0.0, loaded, len(tokens) - loaded, first, ready, engine.exact())


def _coordinated(engine: _Engine, tokens: list[int], request: int, t0: float, timeout: float) -> RequestTimes:
    waited = 0.0
    with engine.conn.prefill_claim(tokens) as claim:
        role = "leader" if claim.leader else "follower"
        if claim.wait_tokens:
            started = time.perf_counter()
            claim.wait(timeout)
            waited = time.perf_counter() - started
        loaded = engine.conn.load(tokens, engine.kv).tokens_loaded
        first = time.perf_counter() - t0
        c = engine.conn.namespace.layout.chunk_tokens
        for start in range(loaded, len(tokens), c):
            engine.compute(start, min(start + c, len(tokens)))
            claim.publish(engine.kv, start + c)
        ready = time.perf_counter() - t0
    return RequestTimes(request, role, waited, loaded, len(tokens) - loaded, first, ready, engine.exact())


Runner = Callable[[_Engine, list[int], int, float, float], RequestTimes]


def _run_mode(
    mode: str, address: str, token: str | None, config: SingleFlightBenchConfig, source: ContiguousKV
) -> ModeReport:
    ns = Namespace(
        model_id="bench/singleflight",
        revision=f"{mode}-{time.time_ns()}",  # a cold cache for every run
        layout=config.layout,
        tokenizer_id="bench",
    )
    tokens = list(range(config.chunks * config.chunk_tokens))
    accelerator = threading.Lock() if config.shared_compute else None
    engines = [
        _Engine(address, token, ns, source, config.prefill_tokens_per_s, accelerator)
        for _ in range(config.requests)
    ]
    for engine in engines:
        engine.client.registration(ns)  # connect and register before the clock starts
    runner: Runner = _coordinated if mode == "coordinated" else _uncoordinated
    barrier = threading.Barrier(config.requests + 1)
    results: list[RequestTimes | BaseException] = [RuntimeError("did not run")] * config.requests
    t0 = 0.0

    def request(i: int) -> None:
        barrier.wait()
        try:
            results[i] = runner(engines[i], tokens, i, t0, config.wait_timeout_s)
        except BaseException as exc:
            results[i] = exc

    threads = [
        threading.Thread(target=request, args=(i,), name=f"request-{i}") for i in range(config.requests)
    ]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    for engine in engines:
        engine.client.close()
    done: list[RequestTimes] = []
    for r in results:
        if isinstance(r, BaseException):
            raise RuntimeError(f"a request failed: {r}") from r
        done.append(r)
    ready = [r.ready_s for r in done]
    return ModeReport(
        mode, sum(r.computed_tokens for r in done), statistics.mean(ready), max(ready), tuple(done)
    )


def measure_single_flight(
    address: str, config: SingleFlightBenchConfig, token: str | None = None
) -> SingleFlightReport:
    """Run both modes against the daemon at ``address``.

    Raises:
        RuntimeError: a request failed.
    """
    n = config.chunks * config.chunk_tokens
    gen = torch.Generator().manual_seed(3)
    shape = (2, n, config.kv_heads, config.head_dim)
    source = ContiguousKV(
        [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(config.layers)]
    )
    modes = tuple(_run_mode(mode, address, token, config, source) for mode in MODES)
    return SingleFlightReport(config, n, modes)


def format_single_flight(report: SingleFlightReport) -> str:
    """The plain-text report: per mode, then per request."""
    c = report.config
    lines = [
        f"single-flight prefill: {c.requests} identical requests on a cold cache, {c.chunks} chunks x "
        f"{c.chunk_tokens} tokens ({report.prompt_tokens} tokens), synthetic prefill "
        f"{c.prefill_tokens_per_s:g} tokens/s "
        + ("on one shared accelerator" if c.shared_compute else "per request"),
        "",
    ]
    rows = [
        [m.mode, str(m.prefill_tokens), f"{m.mean_ready_s:.3f}", f"{m.max_ready_s:.3f}"] for m in report.modes
    ]
    lines += columns(["mode", "prefill tokens", "mean ready s", "max ready s"], rows, frozenset({0}))
    lines += ["", "per request (seconds from arrival):"]
    rrows = [
        [
            m.mode,
            str(r.request),
            r.role,
            f"{r.waited_s:.3f}",
            str(r.loaded_tokens),
            str(r.computed_tokens),
            f"{r.first_load_s:.3f}",
            f"{r.ready_s:.3f}",
            "yes" if r.exact else "NO",
        ]
        for m in report.modes
        for r in m.requests
    ]
    headers = ["mode", "request", "role", "waited", "loaded", "computed", "first load", "ready", "exact"]
    lines += columns(headers, rrows, frozenset({0, 2, 8}))
    return "\n".join(lines)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the subcommand's options to ``parser``."""
    d = SingleFlightBenchConfig()
    parser.add_argument("--address", help="daemon address (default: start one for the run)")
    parser.add_argument("--token", help="bearer token of the daemon at --address")
    parser.add_argument("--requests", type=int, default=d.requests, help=f"requests (default {d.requests})")
    parser.add_argument(
        "--chunks", type=int, default=d.chunks, help=f"chunks per prompt (default {d.chunks})"
    )
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        default=d.chunk_tokens,
        help=f"tokens per chunk (default {d.chunk_tokens})",
    )
    parser.add_argument("--layers", type=int, default=d.layers, help=f"layers (default {d.layers})")
    parser.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    parser.add_argument(
        "--head-dim", type=int, default=d.head_dim, help=f"head dimension (default {d.head_dim})"
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=d.prefill_tokens_per_s,
        help=f"rate of the synthetic prefill (default {d.prefill_tokens_per_s:g})",
    )
    parser.add_argument(
        "--wait-timeout-s",
        type=float,
        default=d.wait_timeout_s,
        help=f"longest follower wait (default {d.wait_timeout_s:g})",
    )
    parser.add_argument(
        "--independent-compute",
        action="store_true",
        help="give every request its own accelerator (default: their prefill steps run one at a time)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every figure as JSON")


def run(args: argparse.Namespace) -> int:
    """Run both modes and print the report; returns the exit status (1 when a request failed)."""
    try:
        config = SingleFlightBenchConfig(
            args.requests,
            args.chunks,
            args.chunk_tokens,
            args.layers,
            args.kv_heads,
            args.head_dim,
            args.prefill_tokens_per_s,
            args.wait_timeout_s,
            not args.independent_compute,
        )
    except ValueError as exc:
        print(f"singleflight: {exc}")
        return 2
    chunk_bytes = config.layout.chunk_bytes
    # Room for every request's stores of both modes, plus the leases of the loads.
    l2 = (2 * config.requests + 2) * config.chunks * chunk_bytes
    daemon_cfg = EmbeddedDaemonConfig(slot_bytes=chunk_bytes, l2_bytes=l2, l3_bytes=0)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tcbench-singleflight-") as work,
            use_daemon(args.address, args.token, daemon_cfg, Path(work)) as daemon,
        ):
            report = measure_single_flight(daemon.address, config, daemon.token)
    except RuntimeError as exc:
        print(f"singleflight: {exc}")
        return 1
    print(format_single_flight(report))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0

"""The ``compare`` benchmark: one store/load workload against what a user would use instead of tiercache.

The workload: ``prompts`` random prompts of ``prompt_tokens`` tokens for a small reference model (see
:mod:`tiercache.bench.compare.refmodel`). Its prefill produces each prompt's real KV; that KV is then stored into
and loaded back from every peer, prompt by prompt, through the engine's per-layer tensors, and every load
is compared byte for byte with the prefill's KV (a mismatch fails the run). Peers:

* recompute: the prefill itself (no cache) — what a load must beat;
* tiercache: a daemon through the connector (shared memory; optionally the byte stream too);
* redis: a local redis-server used as a chunk store (started by the bench, or ``--redis-url``);
* files: one file per chunk in a directory (``fsync`` per file as a flag).

A peer that cannot run here (no redis-server) is reported as skipped with the reason.

One pass of a peer on a shared machine can land on a noisy moment (three single-pass runs moved tiercache's
ratios by ±30 %), so the run is made of ``rounds`` interleaved rounds: every round runs every peer once, in
an order rotated by one peer per round (so that no peer always runs first, or right after the prefill), and
each peer's store and load times are the median round, with the lowest and highest next to them
(:mod:`tiercache.bench.common.spread`). A pass stores every prompt after one untimed warm-up prompt, loads and
verifies each, then clears the peer (so that the next round stores afresh). Recompute's first round is the
prefill that produced the KV; later rounds run the prefill again at their turn.

Ratios are the peer's time over tiercache's (shared memory): how many times faster tiercache restores
(load) or saves (store) the same KV. The ratio of record is that of the medians; the per-round ratios
(round ``i`` of the peer over round ``i`` of tiercache) are kept too, their median and range.

Primitives:
    CompareConfig: the workload, the rounds and the peers' settings.
    PeerResult: one peer's figures.
    CompareReport: the whole run.
    run_compare: run the benchmark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from tiercache.connector import ClientConfig, ContiguousKV, TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVLayout
from tiercache.testing.embedded import EmbeddedDaemonConfig, use_daemon
from tiercache.testing.redis import RedisUnavailableError, use_redis

from ..ceilings import MachineInfo, describe_machine
from ..common.kvcheck import verify_kv, zero_kv, zeros_like_kv
from ..common.progress import ProgressBar
from ..common.spread import RatioSpread, Spread, paired_ratios, spread_of
from ..common.workdir import work_directory
from .peers import ChunkStore, FileStore, RedisStore, TierCacheStore
from .refmodel import ModelSpec, build_model, model_layout, prefill_kv

logger = logging.getLogger(__name__)

TIERCACHE = "tiercache (shared memory)"
"""The peer every ratio is taken against."""

RECOMPUTE = "recompute (prefill)"
"""The peer without a cache: the prefill."""


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """What the ``compare`` benchmark runs.

    Attributes:
        model: the reference model.
        chunk_tokens: tokens per chunk.
        prompts: timed prompts per pass (one more, untimed, warms the peer up).
        prompt_tokens: tokens per prompt (only full chunks are stored).
        rounds: interleaved rounds, each a pass of every peer (1: one pass each).
        fsync: the files peer fsyncs every chunk file.
        redis_url: a Redis to use instead of starting one.
        stream: also measure tiercache's byte stream.
        address: a running daemon, or None to start one.
        token: its bearer token.
        daemon: template of a started daemon (slot size and L2 are set from the workload).
        work_root: where the work directory goes.
        seed: prompt seed.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    chunk_tokens: int = 256
    prompts: int = 8
    prompt_tokens: int = 2048
    rounds: int = 5
    fsync: bool = False
    redis_url: str | None = None
    stream: bool = True
    address: str | None = None
    token: str | None = None
    daemon: EmbeddedDaemonConfig = field(default_factory=EmbeddedDaemonConfig)
    work_root: Path | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts", "chunk_tokens", "rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.prompt_tokens < self.chunk_tokens:
            raise ValueError(
                f"prompt_tokens: {self.prompt_tokens} must hold a chunk of {self.chunk_tokens} tokens"
            )


@dataclass(frozen=True, slots=True)
class PeerResult:
    """One peer's figures over the rounds (each round: every timed prompt).

    Attributes:
        name: the peer.
        status: ``ok`` or ``skipped``.
        reason: why it was skipped (empty when ok).
        store_s: seconds to store every prompt, median round (None: not a store, or skipped).
        load_s: seconds to restore every prompt's KV, median round (recompute: prefill).
        tokens: tokens restored per round.
        nbytes: KV bytes restored per round.
        verified_bytes: bytes compared equal to the prefill's KV, over every round.
        load_ratio: ``load_s / tiercache load_s``, of the medians (None for tiercache itself or when
            skipped).
        store_ratio: ``store_s / tiercache store_s``, of the medians.
        rounds: rounds measured (0 when skipped).
        store_spread: ``store_s`` over the rounds: median, lowest, highest.
        load_spread: ``load_s`` over the rounds.
        store_ratio_spread: the per-round store ratios (round ``i`` over tiercache's round ``i``).
        load_ratio_spread: the per-round load ratios.
        store_rounds_s: every round's store seconds, in round order.
        load_rounds_s: every round's load seconds, in round order.
    """

    name: str
    status: str
    reason: str = ""
    store_s: float | None = None
    load_s: float | None = None
    tokens: int = 0
    nbytes: int = 0
    verified_bytes: int = 0
    load_ratio: float | None = None
    store_ratio: float | None = None
    rounds: int = 0
    store_spread: Spread | None = None
    load_spread: Spread | None = None
    store_ratio_spread: RatioSpread | None = None
    load_ratio_spread: RatioSpread | None = None
    store_rounds_s: tuple[float, ...] = ()
    load_rounds_s: tuple[float, ...] = ()

    @property
    def load_gbps(self) -> float | None:
        """Restored KV bytes per second (median round), decimal GB/s."""
        return None if not self.load_s else self.nbytes / self.load_s / 1e9

    @property
    def store_gbps(self) -> float | None:
        """Stored KV bytes per second (median round), decimal GB/s."""
        return None if not self.store_s else self.nbytes / self.store_s / 1e9

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens restored per second (median round)."""
        return None if not self.load_s else self.tokens / self.load_s

    @property
    def load_gbps_range(self) -> tuple[float, float] | None:
        """Restore GB/s of the slowest and the fastest round."""
        s = self.load_spread
        return None if s is None or s.low <= 0 else (self.nbytes / s.high / 1e9, self.nbytes / s.low / 1e9)


@dataclass(frozen=True, slots=True)
class CompareReport:
    """The outcome of one ``compare`` run.

    Attributes:
        config: what was asked for.
        machine: what it ran on.
        layout: the model's KV chunk layout.
        peers: one result per peer, recompute first.
        redis: the Redis server used (or why none).
        elapsed_s: wall time.
        orders: the order the peers ran in, per round.
    """

    config: CompareConfig
    machine: MachineInfo
    layout: KVLayout
    peers: tuple[PeerResult, ...]
    redis: str
    elapsed_s: float
    orders: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class _Prompt:
    tokens: np.ndarray
    kv: ContiguousKV
    prefill_s: float


@dataclass(frozen=True, slots=True, eq=False)
class _Workload:
    """The model, its chunk layout and the prompts (``prompts[0]`` is the warm-up)."""

    model: Any
    layout: KVLayout
    prompts: list[_Prompt]


class _Pass(NamedTuple):
    """One peer's pass over the timed prompts."""

    store_s: float | None
    load_s: float
    verified: int


@dataclass(frozen=True, slots=True)
class _Peer:
    """A peer in the rotation: its name and one pass (given the round's index)."""

    name: str
    run: Callable[[int], _Pass]


def _workload(config: CompareConfig, bar: ProgressBar) -> _Workload:
    model = build_model(config.model)
    layout = model_layout(config.model, config.chunk_tokens)
    rng = np.random.default_rng(config.seed)
    usable = config.prompt_tokens // config.chunk_tokens * config.chunk_tokens
    out = []
    for _ in range(config.prompts + 1):
        tokens = rng.integers(0, config.model.vocab, size=usable, dtype=np.int64).astype(np.uint32)
        t0 = time.perf_counter()
        kv = prefill_kv(model, tokens)
        out.append(_Prompt(tokens, kv, time.perf_counter() - t0))
        bar.advance()
    return _Workload(model, layout, out)


def _measure(store: ChunkStore, prompts: Sequence[_Prompt], layout: KVLayout, bar: ProgressBar) -> _Pass:
    """Warm up on ``prompts[0]``, then store every other prompt, then load and verify each."""
    chunks = len(prompts[0].tokens) // layout.chunk_tokens
    dst = zeros_like_kv(prompts[0].kv)
    store_s = load_s = 0.0
    verified = 0
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        stored = store.store(p.tokens, p.kv)
        dt = time.perf_counter() - t0
        if stored != chunks:
            raise RuntimeError(f"{store.name}: stored {stored} of {chunks} chunks")
        if i:
            store_s += dt
        bar.advance()
    for i, p in enumerate(prompts):
        zero_kv(dst)
        t0 = time.perf_counter()
        loaded = store.load(p.tokens, dst)
        dt = time.perf_counter() - t0
        if loaded != chunks:
            raise RuntimeError(f"{store.name}: loaded {loaded} of {chunks} chunks")
        n = verify_kv(p.kv, dst, len(p.tokens))
        if i:
            load_s += dt
            verified += n
        bar.advance()
    return _Pass(store_s, load_s, verified)


def _store_pass(store: ChunkStore, work: _Workload, bar: ProgressBar, _round: int) -> _Pass:
    """One pass of ``store``, cleared afterwards so that the next round stores afresh (after a failure the
    run stops, and the store is closed at the end of the run)."""
    result = _measure(store, work.prompts, work.layout, bar)
    store.clear()
    return result


def _recompute_pass(work: _Workload, bar: ProgressBar, round_index: int) -> _Pass:
    """The prefill of every timed prompt: round 0's is the one that produced the KV, later rounds run it."""
    timed = work.prompts[1:]
    if round_index == 0:
        return _Pass(None, sum(p.prefill_s for p in timed), 0)
    total = 0.0
    for p in timed:
        t0 = time.perf_counter()
        prefill_kv(work.model, p.tokens)
        total += time.perf_counter() - t0
        bar.advance()
    return _Pass(None, total, 0)


@contextlib.contextmanager
def _tiercache(
    config: CompareConfig, layout: KVLayout, work: Path
) -> Iterator[tuple[TierCacheClient, TierCacheClient, Namespace]]:
    """A daemon, its client for the same-host peer and one for the byte-stream peer (which stands for an
    engine on another host: its unary calls go through gRPC, not the control socket), and a namespace."""
    chunks = (config.prompts + 1) * (config.prompt_tokens // config.chunk_tokens)
    d = config.daemon
    daemon = EmbeddedDaemonConfig(
        slot_bytes=layout.chunk_bytes,
        l1_device=d.l1_device,
        l1_bytes=max(d.l1_bytes, layout.chunk_bytes),
        l2_bytes=max(d.l2_bytes // layout.chunk_bytes, chunks + 2) * layout.chunk_bytes,
        l3_bytes=d.l3_bytes,
        write_policy=d.write_policy,
        eviction_policy=d.eviction_policy,
    )
    sub = work / "daemon"
    sub.mkdir()
    with use_daemon(config.address, config.token, daemon, sub) as handle:
        client = TierCacheClient.connect(handle.address, handle.token, config=ClientConfig(timeout_s=60.0))
        remote = ClientConfig(timeout_s=60.0, control_socket=False)
        stream_client = TierCacheClient.connect(handle.address, handle.token, config=remote)
        try:
            ns = Namespace("tiercache-bench/compare", f"run-{secrets.token_hex(4)}", layout)
            yield client, stream_client, ns
        finally:
            stream_client.close()
            client.close()


def _rotated(peers: Sequence[_Peer], round_index: int) -> list[_Peer]:
    """``peers`` starting at ``round_index`` (modulo their number): each round starts one peer later."""
    k = round_index % len(peers)
    return [*peers[k:], *peers[:k]]


@dataclass(slots=True)
class _Samples:
    """One peer's passes, in round order."""

    store_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    verified: int = 0

    def add(self, p: _Pass) -> None:
        if p.store_s is not None:
            self.store_s.append(p.store_s)
        self.load_s.append(p.load_s)
        self.verified += p.verified

    def result(self, name: str, tokens: int, nbytes: int) -> PeerResult:
        store = spread_of(self.store_s) if self.store_s else None
        load = spread_of(self.load_s)
        return PeerResult(
            name,
            "ok",
            store_s=None if store is None else store.median,
            load_s=load.median,
            tokens=tokens,
            nbytes=nbytes,
            verified_bytes=self.verified,
            rounds=len(self.load_s),
            store_spread=store,
            load_spread=load,
            store_rounds_s=tuple(self.store_s),
            load_rounds_s=tuple(self.load_s),
        )


def _with_ratios(peers: list[PeerResult]) -> list[PeerResult]:
    """Every ok peer's ratios to tiercache: of the medians, and per round (time over time, round by round)."""
    ref = next((p for p in peers if p.name == TIERCACHE and p.status == "ok"), None)
    if ref is None or not ref.load_s:
        return peers
    out = []
    for p in peers:
        if p.status != "ok" or p is ref:
            out.append(p)
            continue
        stores = bool(p.store_s and ref.store_s)
        out.append(
            dataclasses.replace(
                p,
                load_ratio=p.load_s / ref.load_s if p.load_s else None,
                store_ratio=p.store_s / ref.store_s if p.store_s and ref.store_s else None,
                load_ratio_spread=paired_ratios(p.load_rounds_s, ref.load_rounds_s),
                store_ratio_spread=paired_ratios(p.store_rounds_s, ref.store_rounds_s) if stores else None,
            )
        )
    return out


def run_compare(config: CompareConfig, progress: bool = False) -> CompareReport:
    """Run the workload against every peer, in interleaved rounds; see the module docstring.

    Raises:
        RoundTripError: a peer loaded other bytes than the prefill produced.
        DaemonStartError: the embedded daemon did not start.
        TierCacheError: a daemon call failed.
        RuntimeError: a peer stored or loaded fewer chunks than asked.
    """
    start = time.perf_counter()
    n = config.prompts + 1
    per_store = 2 * n
    stores = 3 + int(config.stream)
    steps = n + config.rounds * stores * per_store + (config.rounds - 1) * config.prompts
    with (
        work_directory(config.work_root) as work,
        ProgressBar(steps, "compare", progress) as bar,
        contextlib.ExitStack() as stack,
    ):
        machine = describe_machine(torch.device("cpu"), work)
        load = _workload(config, bar)
        layout = load.layout
        client, stream_client, ns = stack.enter_context(_tiercache(config, layout, work))
        chunk_stores: list[ChunkStore] = [TierCacheStore(ns, client)]
        if config.stream:
            ns_stream = Namespace(ns.model_id, ns.revision + "-stream", layout)
            chunk_stores.append(TierCacheStore(ns_stream, stream_client, force_remote=True))
        skipped: list[PeerResult] = []
        redis_desc = ""
        try:
            rclient, redis_desc = stack.enter_context(use_redis(config.redis_url, work))
            chunk_stores.append(RedisStore(ns, rclient))
        except RedisUnavailableError as exc:
            logger.warning("redis skipped: %s", exc)
            redis_desc = f"skipped: {exc}"
            skipped.append(PeerResult("redis", "skipped", str(exc)))
            bar.advance(config.rounds * per_store)
        chunk_stores.append(FileStore(ns, work / "files", config.fsync))
        for s in chunk_stores:
            stack.callback(s.close)
        peers = [_Peer(RECOMPUTE, partial(_recompute_pass, load, bar))]
        peers += [_Peer(s.name, partial(_store_pass, s, load, bar)) for s in chunk_stores]
        samples = {p.name: _Samples() for p in peers}
        orders = []
        for r in range(config.rounds):
            order = _rotated(peers, r)
            orders.append(tuple(p.name for p in order))
            logger.info("round %d of %d: %s", r + 1, config.rounds, ", ".join(orders[-1]))
            for peer in order:
                samples[peer.name].add(peer.run(r))
    tokens = sum(len(p.tokens) for p in load.prompts[1:])
    nbytes = tokens // layout.chunk_tokens * layout.chunk_bytes
    results = [samples[p.name].result(p.name, tokens, nbytes) for p in peers]
    results[-1:-1] = skipped  # redis (skipped) keeps its place, before files
    return CompareReport(
        config,
        machine,
        layout,
        tuple(_with_ratios(results)),
        redis_desc,
        time.perf_counter() - start,
        tuple(orders),
    )

"""The ``compare`` benchmark: one store/load workload against what a user would use instead of tiercache.

The workload: ``prompts`` random prompts of ``prompt_tokens`` tokens for a small reference model (see
:mod:`tiercache.bench.refmodel`). Its prefill produces each prompt's real KV; that KV is then stored into
and loaded back from every peer, prompt by prompt, through the engine's per-layer tensors, and every load
is compared byte for byte with the prefill's KV (a mismatch fails the run). Peers:

* recompute: the prefill itself (no cache) — what a load must beat;
* tiercache: a daemon through the connector (shared memory; optionally the byte stream too);
* redis: a local redis-server used as a chunk store (started by the bench, or ``--redis-url``);
* files: one file per chunk in a directory (``fsync`` per file as a flag).

A peer that cannot run here (no redis-server) is reported as skipped with the reason. One untimed
warm-up prompt goes through every peer first. Ratios are the peer's time over tiercache's (shared memory):
how many times faster tiercache restores (load) or saves (store) the same KV.

Primitives:
    CompareConfig: the workload and the peers' settings.
    PeerResult: one peer's figures.
    CompareReport: the whole run.
    run_compare: run the benchmark.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tiercache.connector import ClientConfig, ContiguousKV, TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

from .ceilings import MachineInfo, describe_machine
from .daemon_proc import EmbeddedDaemonConfig, use_daemon
from .kvcheck import verify_kv, zero_kv, zeros_like_kv
from .peers import ChunkStore, FileStore, RedisStore, TierCacheStore
from .progress import ProgressBar
from .redis_server import RedisUnavailableError, use_redis
from .refmodel import ModelSpec, build_model, model_layout, prefill_kv
from .runner import work_directory

logger = logging.getLogger(__name__)

TIERCACHE = "tiercache (shared memory)"
"""The peer every ratio is taken against."""


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """What the ``compare`` benchmark runs.

    Attributes:
        model: the reference model.
        chunk_tokens: tokens per chunk.
        prompts: timed prompts (one more, untimed, warms every peer up).
        prompt_tokens: tokens per prompt (only full chunks are stored).
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
    fsync: bool = False
    redis_url: str | None = None
    stream: bool = True
    address: str | None = None
    token: str | None = None
    daemon: EmbeddedDaemonConfig = field(default_factory=EmbeddedDaemonConfig)
    work_root: Path | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prompts <= 0 or self.chunk_tokens <= 0:
            raise ValueError("prompts and chunk_tokens must be positive")
        if self.prompt_tokens < self.chunk_tokens:
            raise ValueError(f"prompt_tokens ({self.prompt_tokens}) must hold a chunk of {self.chunk_tokens}")


@dataclass(frozen=True, slots=True)
class PeerResult:
    """One peer's figures over the timed prompts.

    Attributes:
        name: the peer.
        status: ``ok`` or ``skipped``.
        reason: why it was skipped (empty when ok).
        store_s: seconds to store every prompt (None: not a store, or skipped).
        load_s: seconds to restore every prompt's KV (recompute: prefill).
        tokens: tokens restored.
        nbytes: KV bytes restored.
        verified_bytes: bytes compared equal to the prefill's KV.
        load_ratio: ``load_s / tiercache load_s`` (None for tiercache itself or when skipped).
        store_ratio: ``store_s / tiercache store_s``.
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

    @property
    def load_gbps(self) -> float | None:
        """Restored KV bytes per second, decimal GB/s."""
        return None if not self.load_s else self.nbytes / self.load_s / 1e9

    @property
    def store_gbps(self) -> float | None:
        """Stored KV bytes per second, decimal GB/s."""
        return None if not self.store_s else self.nbytes / self.store_s / 1e9

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens restored per second."""
        return None if not self.load_s else self.tokens / self.load_s


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
    """

    config: CompareConfig
    machine: MachineInfo
    layout: KVLayout
    peers: tuple[PeerResult, ...]
    redis: str
    elapsed_s: float


@dataclass(frozen=True, slots=True, eq=False)
class _Prompt:
    tokens: np.ndarray
    kv: ContiguousKV
    prefill_s: float


def _prompts(config: CompareConfig, bar: ProgressBar) -> tuple[list[_Prompt], KVLayout]:
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
    return out, layout


def _measure(store: ChunkStore, prompts: Sequence[_Prompt], layout: KVLayout, bar: ProgressBar) -> PeerResult:
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
    timed = prompts[1:]
    tokens = sum(len(p.tokens) for p in timed)
    return PeerResult(
        store.name,
        "ok",
        "",
        store_s,
        load_s,
        tokens,
        tokens // layout.chunk_tokens * layout.chunk_bytes,
        verified,
    )


@contextlib.contextmanager
def _tiercache(
    config: CompareConfig, layout: KVLayout, work: Path
) -> Iterator[tuple[TierCacheClient, Namespace]]:
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
        try:
            yield client, Namespace("tiercache-bench/compare", f"run-{secrets.token_hex(4)}", layout)
        finally:
            client.close()


def _with_ratios(peers: list[PeerResult]) -> list[PeerResult]:
    ref = next((p for p in peers if p.name == TIERCACHE and p.status == "ok"), None)
    if ref is None or not ref.load_s:
        return peers
    out = []
    for p in peers:
        if p.status != "ok" or p is ref:
            out.append(p)
            continue
        load_ratio = p.load_s / ref.load_s if p.load_s else None
        store_ratio = p.store_s / ref.store_s if p.store_s and ref.store_s else None
        out.append(
            PeerResult(p.name, p.status, p.reason, p.store_s, p.load_s, p.tokens, p.nbytes, p.verified_bytes,
                       load_ratio, store_ratio)
        )  # fmt: skip
    return out


def run_compare(config: CompareConfig, progress: bool = False) -> CompareReport:
    """Run the workload against every peer; see the module docstring.

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
    with (
        work_directory(config.work_root) as work,
        ProgressBar(n + stores * per_store, "compare", progress) as bar,
    ):
        machine = describe_machine(torch.device("cpu"), work)
        prompts, layout = _prompts(config, bar)
        timed = prompts[1:]
        tokens = sum(len(p.tokens) for p in timed)
        nbytes = tokens // layout.chunk_tokens * layout.chunk_bytes
        peers = [
            PeerResult("recompute (prefill)", "ok", "", None, sum(p.prefill_s for p in timed), tokens, nbytes)
        ]
        with _tiercache(config, layout, work) as (client, ns):
            peers.append(_measure(TierCacheStore(ns, client), prompts, layout, bar))
            if config.stream:
                ns_stream = Namespace(ns.model_id, ns.revision + "-stream", layout)
                peers.append(
                    _measure(TierCacheStore(ns_stream, client, force_remote=True), prompts, layout, bar)
                )
        redis_desc = ""
        try:
            with use_redis(config.redis_url, work) as (rclient, redis_desc):
                peers.append(_measure(RedisStore(ns, rclient), prompts, layout, bar))
        except RedisUnavailableError as exc:
            logger.warning("redis skipped: %s", exc)
            redis_desc = f"skipped: {exc}"
            peers.append(PeerResult("redis", "skipped", str(exc)))
            bar.advance(per_store)
        files = FileStore(ns, work / "files", config.fsync)
        peers.append(_measure(files, prompts, layout, bar))
    peers = _with_ratios(peers)
    return CompareReport(config, machine, layout, tuple(peers), redis_desc, time.perf_counter() - start)

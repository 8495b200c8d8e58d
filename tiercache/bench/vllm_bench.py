"""The measurements of ``tiercache-bench vllm``: TTFT of fresh vLLM engines with and without cached prefixes.

Every column runs in its own engine processes (:mod:`.vllm_engine`) on the same model and prompts, and each
(prompt length, cached fraction) is timed ``repeats`` times on distinct prompts (median kept):

* ``recompute``: a fresh engine, nothing cached;
* ``ideal``: the prefix is in the engine's own prefix cache (run just before, same process);
* ``tiercache_l2``: engine A stores the prefixes through the connector, a fresh engine B times the prompts;
* ``tiercache_l3``: the same after a daemon restart (the chunks survive only in L3);
* ``lmcache``: LMCache's multiprocess server (shared memory on) through ``LMCacheMPConnector``;
* ``example``: vLLM's ``ExampleConnector`` (safetensors files on disk).

A peer that cannot be imported or started is a skipped column with the reason.

Primitives:
    VllmBenchConfig: what to measure.
    Column: one column's medians (or the reason it was skipped).
    build_model: the random-weight Llama the engines serve.
    run_bench: every column.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .daemon_proc import EmbeddedDaemonConfig, start_daemon
from .vllm_engine import RESULT

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
        seed: weights and prompts.
    """

    lengths: tuple[int, ...] = (1024, 2048, 4096)
    fractions: tuple[int, ...] = (0, 50, 100)
    repeats: int = 3
    chunk_tokens: int = 256
    block_size: int = 32
    hidden: int = 512
    layers: int = 4
    peers: bool = True
    seed: int = 0


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


def build_model(path: Path, config: VllmBenchConfig) -> Path:
    """Save a random-weight Llama (float32, head size 64) under ``path``."""
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
        max_position_embeddings=max(config.lengths) + 64,
    )
    model = LlamaForCausalLM(llama)  # type: ignore[no-untyped-call, unused-ignore]  # float32 by default
    model.save_pretrained(path, safe_serialization=True)
    return path


def _prompt(seed: int, n: int) -> list[int]:
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
                out.append(_Case(length, fraction, _prompt(seed, length)))
    return out


def _run_engine(
    model: Path, config: VllmBenchConfig, kv: dict[str, Any] | None, jobs: list[dict[str, Any]]
) -> dict[str, Any]:
    params = {"model": str(model), "block_size": config.block_size, "kv": kv, "jobs": jobs,
              "max_model_len": max(config.lengths) + 64}  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    warm = [{"warm": None, "prompt": _prompt(999_999, 64)}]  # the first request of an engine is slow
    params["jobs"] = warm + jobs
    out = subprocess.run(
        [sys.executable, "-m", "tiercache.bench.vllm_engine"],
        input=json.dumps(params), capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S, env=env,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode != 0 or len(lines) != 1:
        raise RuntimeError(f"vLLM engine failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[0][len(RESULT) :])
    result["jobs"] = result["jobs"][1:]
    return result


def _column(name: str, cases: list[_Case], result: dict[str, Any]) -> Column:
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


def _store_then_time(
    name: str, model: Path, config: VllmBenchConfig, kv: dict[str, Any], salt: int
) -> Column:
    """Engine A stores every case's prefix through ``kv``; a fresh engine B times the prompts."""
    cases = _cases(config, salt)
    _run_engine(model, config, kv, [{"warm": None, "prompt": c.prefix} for c in cases if c.prefix])
    return _column(
        name, cases, _run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in cases])
    )


def _tiercache_kv(address: str, config: VllmBenchConfig) -> dict[str, Any]:
    return {
        "kv_connector": "TierCacheConnector",
        "kv_connector_module_path": "tiercache.connector.vllm",
        "kv_connector_extra_config": {"address": address, "chunk_tokens": config.chunk_tokens},
    }


def _tiercache_columns(model: Path, config: VllmBenchConfig, work: Path) -> list[Column]:
    kv_heads = max(1, (config.hidden // 64) // 2)
    chunk_bytes = config.layers * 2 * kv_heads * 64 * 4 * config.chunk_tokens
    daemon = EmbeddedDaemonConfig(slot_bytes=chunk_bytes, l2_bytes=2 << 30, l3_bytes=8 << 30)
    l2_cases, l3_cases = _cases(config, 2), _cases(config, 3)
    with start_daemon(daemon, work) as handle:
        kv = _tiercache_kv(handle.address, config)
        stores = [{"warm": None, "prompt": c.prefix} for c in l2_cases + l3_cases if c.prefix]
        _run_engine(model, config, kv, stores)
        l2 = _column(
            "tiercache_l2",
            l2_cases,
            _run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in l2_cases]),
        )
    with start_daemon(daemon, work) as handle:  # a restart: L2 is empty, L3 kept the chunks
        kv = _tiercache_kv(handle.address, config)
        l3 = _column(
            "tiercache_l3",
            l3_cases,
            _run_engine(model, config, kv, [{"warm": None, "prompt": c.prompt} for c in l3_cases]),
        )
    return [l2, l3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _lmcache_server(work: Path) -> Iterator[int]:
    """An LMCache multiprocess server (shared memory on); yields its port."""
    exe = shutil.which("lmcache") or str(Path(sys.executable).with_name("lmcache"))
    port, http = _free_port(), _free_port()
    argv = [exe, "server", "--host", "127.0.0.1", "--port", str(port), "--http-host", "127.0.0.1",
            "--http-port", str(http), "--l1-size-gb", "2", "--eviction-policy", "LRU", "--chunk-size", "256",
            "--max-workers", "1", "--disable-observability", "--supported-transfer-mode", "auto",
            "--shm-name", f"tcbench-lmc-{secrets.token_hex(3)}"]  # fmt: skip
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"}
    log = (work / "lmcache.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"lmcache server exited with {proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)  # a bounded wait on the process between connection attempts
        else:
            raise RuntimeError("lmcache server did not listen in time")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def _peer_columns(model: Path, config: VllmBenchConfig, work: Path) -> list[Column]:
    columns = []
    if importlib.util.find_spec("lmcache") is None:
        columns.append(Column("lmcache", skipped="lmcache is not installed (pip install lmcache==0.5.6)"))
    else:
        try:
            with _lmcache_server(work) as port:
                kv = {"kv_connector": "LMCacheMPConnector",
                      "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port}}  # fmt: skip
                columns.append(_store_then_time("lmcache", model, config, kv, 4))
        except (RuntimeError, OSError) as exc:
            columns.append(Column("lmcache", skipped=f"could not run: {str(exc)[-300:]}"))
    store = tempfile.mkdtemp(prefix="tcbench-example-", dir=work)
    kv = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": store}}
    try:
        columns.append(_store_then_time("example", model, config, kv, 5))
    except RuntimeError as exc:
        columns.append(Column("example", skipped=f"could not run: {str(exc)[-300:]}"))
    return columns


def run_bench(config: VllmBenchConfig, work: Path) -> list[Column]:
    """Measure every column (see the module docstring) with ``work`` as the scratch directory."""
    model = build_model(work / "model", config)
    plain_cases = _cases(config, 0)
    ideal_cases = _cases(config, 1)
    jobs = [{"warm": None, "prompt": c.prompt} for c in plain_cases]
    jobs += [{"warm": c.prefix or None, "prompt": c.prompt} for c in ideal_cases]
    plain = _run_engine(model, config, None, jobs)
    n = len(plain_cases)
    columns = [
        _column("recompute", plain_cases, {"jobs": plain["jobs"][:n]}),
        _column("ideal", ideal_cases, {"jobs": plain["jobs"][n:]}),
    ]
    columns += _tiercache_columns(model, config, work)
    if config.peers:
        columns += _peer_columns(model, config, work)
    else:
        columns += [Column(name, skipped="--no-peers") for name in ("lmcache", "example")]
    return columns

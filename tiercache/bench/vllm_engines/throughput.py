"""The throughput line of ``tiercache-bench vllm``: requests sharing a system prompt across two engines.

``throughput_requests`` prompts (one system prompt of ``system_tokens`` + ``user_tokens`` of each request's
own) are split between two fresh engine processes that start together and serve their half one request at
a time (one output token each); requests/s is all the requests over the wall time from the first request's
start to the last one's end, TTFT the mean request latency. Measured twice in one run:

* ``plain``: no connector: each engine computes the system prompt once, then hits its own prefix cache;
* ``tiercache``: both engines on one daemon that already holds the system prompt (stored by an earlier
  engine, as a long-lived daemon would: the bench's tiercache store engine stores :func:`system_prompt`
  with its prefixes): each engine's first request loads it instead of computing it.

Primitives:
    Throughput: one line's figures.
    system_prompt: the shared system prompt.
    measure: one line (two engines, with a connector or not).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiercache.testing.engine import EngineProcess

from .columns import (
    ENGINE_TIMEOUT_S,
    VllmBenchConfig,
    engine_argv,
    engine_env,
    engine_params,
    prompt,
    without_warmup,
)


@dataclass(frozen=True, slots=True)
class Throughput:
    """One throughput line.

    Attributes:
        name: ``plain`` or ``tiercache``.
        requests: requests served (over both engines).
        requests_per_s: requests over the wall time of all of them.
        mean_ttft_s: mean request latency (one output token).
        cached_tokens: prompt tokens vLLM reported cached, summed over the requests.
    """

    name: str
    requests: int
    requests_per_s: float
    mean_ttft_s: float
    cached_tokens: int


def system_prompt(config: VllmBenchConfig) -> list[int]:
    """The system prompt every throughput request starts with."""
    return prompt(config.seed * 7919 + 4242, config.system_tokens)


def _requests(config: VllmBenchConfig) -> list[list[int]]:
    system = system_prompt(config)
    return [
        system + prompt(config.seed * 7919 + 5000 + i, config.user_tokens)
        for i in range(config.throughput_requests)
    ]


def measure(
    name: str, model: Path, config: VllmBenchConfig, kv: dict[str, Any] | None, work: Path
) -> Throughput:
    reqs = _requests(config)
    halves = [reqs[0::2], reqs[1::2]]
    logs = [Path(tempfile.mkstemp(prefix=f"tput-{name}-", suffix=".log", dir=work)[1]) for _ in halves]
    engines: list[EngineProcess] = []
    try:
        for half, log_path in zip(halves, logs):
            todo: list[dict[str, Any]] = [{"warm": None, "prompt": p} for p in half]
            params = {**engine_params(model, config, kv, todo), "wait_go": True}
            engines.append(EngineProcess(engine_argv(), params, env=engine_env(), stderr_path=log_path))
        for engine in engines:
            engine.message(ENGINE_TIMEOUT_S)  # started, waits for the go line
        for engine in engines:
            engine.tell("go")
        results = [without_warmup(engine.result(ENGINE_TIMEOUT_S)) for engine in engines]
    finally:
        for engine in engines:
            engine.close()
    jobs = [job for r in results for job in r["jobs"]]
    wall = max(j["t1"] for j in jobs) - min(j["t0"] for j in jobs)
    return Throughput(
        name,  # one line: the engines of ``kv`` (None: no connector)
        len(jobs),
        len(jobs) / wall if wall > 0 else 0.0,
        statistics.fmean(j["s"] for j in jobs),
        sum(int(j["cached"]) for j in jobs),
    )

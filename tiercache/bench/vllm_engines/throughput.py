"""The throughput line of ``tiercache-bench vllm``: requests sharing a system prompt across two engines.

``throughput_requests`` prompts (one system prompt of ``system_tokens`` + ``user_tokens`` of each request's
own) are split between two fresh engine processes that start together and serve their half one request at
a time (one output token each); requests/s is all the requests over the wall time from the first request's
start to the last one's end, TTFT the mean request latency. Two lines, each measured ``repeats`` times,
interleaved (plain, tiercache, plain, ...), the run of median requests/s kept with every run's figure: one
run of either line at times took a third of its usual rate (plain 3.34 against 10.1-10.4 req/s, tiercache
3.79 and 4.52 against 12.2-13.5, same code, minutes apart), and one run used to decide the line.

* ``plain``: no connector: each engine computes the system prompt once, then hits its own prefix cache;
* ``tiercache``: both engines on one daemon that already holds the system prompt (stored by an earlier
  engine, as a long-lived daemon would: the bench's tiercache store engine stores :func:`system_prompt`
  with its prefixes): each engine's first request loads it instead of computing it.

Primitives:
    Throughput: one line's figures.
    system_prompt: the shared system prompt.
    measure: one run of a line (two engines, with a connector or not).
    measure_lines: both lines, runs interleaved, medians kept.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, replace
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
        runs_per_s: requests/s of every run of the line (the figures above are its median run's).
    """

    name: str
    requests: int
    requests_per_s: float
    mean_ttft_s: float
    cached_tokens: int
    runs_per_s: tuple[float, ...] = ()


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
    rate = len(jobs) / wall if wall > 0 else 0.0
    return Throughput(
        name,  # one line: the engines of ``kv`` (None: no connector)
        len(jobs),
        rate,
        statistics.fmean(j["s"] for j in jobs),
        sum(int(j["cached"]) for j in jobs),
        (rate,),
    )


def measure_lines(
    model: Path, config: VllmBenchConfig, kv: dict[str, Any], work: Path
) -> tuple[Throughput, Throughput]:
    """The plain and tiercache lines (``kv``: the connector's), ``config.repeats`` runs each, interleaved;
    each line is its run of median requests/s, with every run's requests/s."""
    runs: dict[str, list[Throughput]] = {"plain": [], "tiercache": []}
    for _ in range(max(1, config.repeats)):
        runs["plain"].append(measure("plain", model, config, None, work))
        runs["tiercache"].append(measure("tiercache", model, config, kv, work))
    plain, tiercache = (_median_run(line) for line in runs.values())
    return plain, tiercache


def _median_run(runs: list[Throughput]) -> Throughput:
    ordered = sorted(runs, key=lambda t: t.requests_per_s)
    median = ordered[(len(ordered) - 1) // 2]
    return replace(median, runs_per_s=tuple(t.requests_per_s for t in runs))

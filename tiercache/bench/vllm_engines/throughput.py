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

import json
import statistics
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..vllm_engine import READY
from .columns import (
    ENGINE_TIMEOUT_S,
    VllmBenchConfig,
    engine_argv,
    engine_env,
    engine_params,
    parse_result,
    prompt,
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


class _Engine:
    """One engine process that waits for the go line; its stdout is read by a thread (no pipe stalls)."""

    def __init__(self, params: dict[str, Any], log: IO[bytes]) -> None:
        self.proc = subprocess.Popen(
            engine_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=engine_env()
        )  # fmt: skip
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({**params, "wait_go": True}) + "\n")
        self.proc.stdin.flush()
        self.ready = threading.Event()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == READY:
                self.ready.set()
        self.ready.set()  # the process ended (failed before it was ready): stop waiting

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()

    def result(self, log_path: Path) -> dict[str, Any]:
        code = self.proc.wait(ENGINE_TIMEOUT_S)
        self._reader.join()
        return parse_result(code, "".join(self.lines), log_path.read_text(errors="replace"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def measure(
    name: str, model: Path, config: VllmBenchConfig, kv: dict[str, Any] | None, work: Path
) -> Throughput:
    reqs = _requests(config)
    halves = [reqs[0::2], reqs[1::2]]
    logs = [Path(tempfile.mkstemp(prefix=f"tput-{name}-", suffix=".log", dir=work)[1]) for _ in halves]
    engines: list[_Engine] = []
    try:
        for half, log_path in zip(halves, logs):
            with log_path.open("wb") as log:
                todo: list[dict[str, Any]] = [{"warm": None, "prompt": p} for p in half]
                engines.append(_Engine(engine_params(model, config, kv, todo), log))
        for engine in engines:
            if not engine.ready.wait(ENGINE_TIMEOUT_S):
                raise RuntimeError("a throughput engine did not start in time")
        for engine in engines:
            engine.go()
        results = [engine.result(log_path) for engine, log_path in zip(engines, logs)]
    finally:
        for engine in engines:
            engine.kill()
    jobs = [job for r in results for job in r["jobs"]]
    wall = max(j["t1"] for j in jobs) - min(j["t0"] for j in jobs)
    return Throughput(
        name,  # one line: the engines of ``kv`` (None: no connector)
        len(jobs),
        len(jobs) / wall if wall > 0 else 0.0,
        statistics.fmean(j["s"] for j in jobs),
        sum(int(j["cached"]) for j in jobs),
    )

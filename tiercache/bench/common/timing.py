"""Timing of one benchmark phase: throughput over the phase, latency percentiles per call.

A phase is a sequence of calls (one batch of chunks each). Throughput is the bytes the phase moved divided
by its wall time (including whatever ``finish`` does, e.g. a final fsync); latencies are per call. Device
work queued by a call (CUDA) is waited for before its timer stops.

Primitives:
    Timing: bytes, calls, seconds and per-call p50/p99 of one phase; ``gbps`` is decimal GB/s.
    summarize: a Timing from a phase's wall time and per-call durations.
    time_calls: run and time a phase.
    synchronize: wait for queued work on a device (no-op on the CPU).
    Latency / time_latency: per-call latency percentiles of a phase of small calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Timing:
    """Throughput and per-call latency of one timed phase.

    Attributes:
        total_bytes: payload bytes the phase moved.
        calls: timed calls (batches) in the phase.
        seconds: wall time of the whole phase.
        p50_s: median latency of one call, in seconds.
        p99_s: 99th-percentile latency of one call, in seconds (linear interpolation).
    """

    total_bytes: int
    calls: int
    seconds: float
    p50_s: float
    p99_s: float

    @property
    def gbps(self) -> float:
        """Throughput in decimal GB/s (1e9 bytes per second)."""
        return self.total_bytes / self.seconds / 1e9

    @property
    def p50_ms(self) -> float:
        """Median per-call latency in milliseconds."""
        return self.p50_s * 1e3

    @property
    def p99_ms(self) -> float:
        """99th-percentile per-call latency in milliseconds."""
        return self.p99_s * 1e3


def summarize(total_bytes: int, seconds: float, durations: Sequence[float]) -> Timing:
    """Build a :class:`Timing` from a phase's wall time and its per-call durations.

    Args:
        total_bytes: payload bytes moved by the phase; positive.
        seconds: wall time of the phase; positive.
        durations: one duration per call, in seconds; at least one.

    Raises:
        ValueError: no calls, or a non-positive byte count or wall time.
    """
    if not durations:
        raise ValueError("a phase needs at least one timed call")
    if total_bytes <= 0 or seconds <= 0:
        raise ValueError(f"bytes ({total_bytes}) and seconds ({seconds}) must be positive")
    arr = np.asarray(durations, dtype=np.float64)
    p50, p99 = (float(v) for v in np.percentile(arr, [50.0, 99.0]))
    return Timing(total_bytes=total_bytes, calls=len(durations), seconds=seconds, p50_s=p50, p99_s=p99)


def synchronize(device: torch.device) -> None:
    """Wait for work queued on ``device`` (CUDA); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(
    calls: Iterable[Callable[[], object]],
    total_bytes: int,
    device: torch.device,
    finish: Callable[[], object] | None = None,
) -> Timing:
    """Run ``calls`` one after the other and time each, then ``finish`` (counted in the wall time only).

    Args:
        calls: the phase's calls, one batch each.
        total_bytes: payload bytes the calls move together.
        device: device whose queued work each call must include (CUDA is synchronized after each call).
        finish: optional closing step (e.g. fsync) included in the phase's wall time but in no call.

    Returns:
        The phase's timing.
    """
    durations: list[float] = []
    synchronize(device)
    start = time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        call()
        synchronize(device)
        durations.append(time.perf_counter() - t0)
    if finish is not None:
        finish()
    synchronize(device)
    return summarize(total_bytes, time.perf_counter() - start, durations)


@dataclass(frozen=True, slots=True)
class Latency:
    """Per-call latency of a phase of small calls (no payload to speak of).

    Attributes:
        calls: timed calls.
        p50_s: median latency, seconds.
        p99_s: 99th-percentile latency, seconds (linear interpolation).
        mean_s: mean latency, seconds.
    """

    calls: int
    p50_s: float
    p99_s: float
    mean_s: float

    @property
    def p50_ms(self) -> float:
        """Median latency in milliseconds."""
        return self.p50_s * 1e3

    @property
    def p99_ms(self) -> float:
        """99th-percentile latency in milliseconds."""
        return self.p99_s * 1e3


def time_latency(call: Callable[[], object], calls: int, warmup: int = 0) -> Latency:
    """Call ``call`` ``warmup`` times untimed, then ``calls`` times, timing each call.

    Raises:
        ValueError: ``calls`` is not positive.
    """
    if calls <= 0:
        raise ValueError(f"calls must be positive, got {calls}")
    for _ in range(warmup):
        call()
    durations = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        durations.append(time.perf_counter() - t0)
    arr = np.asarray(durations, dtype=np.float64)
    p50, p99 = (float(v) for v in np.percentile(arr, [50.0, 99.0]))
    return Latency(calls=calls, p50_s=p50, p99_s=p99, mean_s=float(arr.mean()))

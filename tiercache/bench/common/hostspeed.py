"""How fast the host runs right now: a fixed piece of work timed next to each measurement.

The shared 2-core hosts these benches run on have slow phases: minutes in which everything, plain vLLM
included, runs at half speed, with no steal time to show for it (one serve run's plain ITL p50 was 13.7 ms
where the run before measured 6.1 ms). A column measured in such a phase loses against one measured outside
it, whatever either does. Timing the same small piece of work before and after every measurement, and
printing it against the run's median, shows which figures came from a slow phase.

The work is what a small engine's step does on the CPU: one-thread matrix products of a small model's size
and a stretch of interpreter work; the median of a few rounds is the figure (one preempted round does not
decide it).

Primitives:
    PROBE_ROUNDS: rounds per probe.
    probe_host_ms: one probe, in ms.
"""

from __future__ import annotations

import statistics
import time

import torch

PROBE_ROUNDS = 3
"""Rounds per probe; the median is the figure."""

_MATMULS = 20
_ROWS, _HIDDEN = 128, 512
_LOOP = 300_000


def probe_host_ms(rounds: int = PROBE_ROUNDS) -> float:
    """Time the fixed work ``rounds`` times in this process (torch on one thread, restored after): the
    median round, in ms. Takes ~0.1-0.3 s on an idle 2-core host."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    a = torch.ones(_ROWS, _HIDDEN)
    b = torch.ones(_HIDDEN, _HIDDEN)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(_MATMULS):
                torch.mm(a, b)
            total = 0
            for i in range(_LOOP):
                total += i
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return 1e3 * statistics.median(times)

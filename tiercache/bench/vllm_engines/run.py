"""Every measurement of ``tiercache-bench vllm`` in one run: the TTFT columns and the throughput line.

Primitives:
    VllmBenchResult: the columns and the throughput lines of a run.
    run_bench: measure them all (see :mod:`.columns`, :mod:`.peers`, :mod:`.throughput`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .columns import Column, VllmBenchConfig, build_model, plain_columns, tiercache_columns
from .peers import peer_columns
from .throughput import Throughput, measure_lines, system_prompt


@dataclass(frozen=True, slots=True)
class VllmBenchResult:
    """One run of the bench.

    Attributes:
        columns: the TTFT columns (skipped ones carry their reason).
        throughput: the throughput lines (empty when not measured).
    """

    columns: tuple[Column, ...]
    throughput: tuple[Throughput, ...]


def run_bench(config: VllmBenchConfig, work: Path) -> VllmBenchResult:
    """Measure every column and the throughput line with ``work`` as the scratch directory.

    Raises:
        RuntimeError: an engine (of tiercache's or the plain columns) or the daemon failed.
    """
    model = build_model(work / "model", config)
    lines: list[Throughput] = []
    columns = plain_columns(model, config)
    if config.throughput:
        # A system prompt one token longer is stored: vLLM never loads a prompt's last token, so the shared
        # system prompt's last full chunk is in the daemon only if a longer prompt was served.
        stores = [[*system_prompt(config), 1]]
        columns += tiercache_columns(
            model,
            config,
            work,
            stores,
            lambda kv: lines.extend(measure_lines(model, config, kv, work)),
        )
    else:
        columns += tiercache_columns(model, config, work)
    if config.peers:
        columns += peer_columns(model, config, work)
    else:
        columns += [Column(name, skipped="--no-peers") for name in ("lmcache", "example")]
    return VllmBenchResult(tuple(columns), tuple(lines))

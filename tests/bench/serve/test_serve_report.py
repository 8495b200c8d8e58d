"""The table and rows of ``tiercache-bench serve`` from measurements (no vLLM needed)."""

from __future__ import annotations

import dataclasses

from tiercache.bench.serve.client import Outcome
from tiercache.bench.serve.columns import ColumnKind
from tiercache.bench.serve.report import format_table, rows
from tiercache.bench.serve.run import Cell, Measured, ServeResult
from tiercache.bench.serve.workloads import WorkloadKind, build


def _measured(cell: Cell, column: ColumnKind, repeat: int, probe_ms: float | None) -> Measured:
    outcomes = tuple(
        Outcome(0, i, start=float(i), ttft_s=0.05, itl_s=0.01, end=float(i) + 0.5, prompt_tokens=64,
                output=(1, 2, 3), cached_tokens=32, reusable_tokens=0)
        for i in range(4)
    )  # fmt: skip
    return Measured(cell, column, repeat, outcomes, 3.5, 128, 0, host_probe_ms=probe_ms)


def test_each_row_says_how_fast_the_host_ran_against_the_run() -> None:
    cell = Cell(WorkloadKind.CHAT, True, 1)
    measured = (
        _measured(cell, ColumnKind.PLAIN, 0, 100.0),
        _measured(cell, ColumnKind.PLAIN, 1, 110.0),
        _measured(cell, ColumnKind.TIERCACHE_L2, 0, 200.0),
        _measured(cell, ColumnKind.TIERCACHE_L2, 1, 220.0),
    )
    result = ServeResult(measured, {}, {}, {cell: build(WorkloadKind.CHAT, 2048, 0, 4)}, None, 10.0)
    by = {r["column"]: r for r in rows(result)}
    # the run's median probe is 155 ms: plain's rows ran at the usual speed or faster, tiercache's in a slow phase
    assert by["plain"]["host_probe_ms"] == 105.0 and by["tiercache_l2"]["host_probe_ms"] == 210.0
    assert abs(by["plain"]["host_vs_run"] - 105 / 155) < 1e-9
    assert abs(by["tiercache_l2"]["host_vs_run"] - 210 / 155) < 1e-9
    text = format_table(result)
    assert " host " in text.splitlines()[0] and "1.35x" in text and "0.68x" in text


def test_a_run_without_probes_prints_no_host_speed() -> None:
    cell = Cell(WorkloadKind.CHAT, True, 1)
    result = ServeResult((_measured(cell, ColumnKind.PLAIN, 0, None),), {}, {},
                         {cell: build(WorkloadKind.CHAT, 2048, 0, 4)}, None, 1.0)  # fmt: skip
    (row,) = rows(result)
    assert row["host_probe_ms"] is None and row["host_vs_run"] is None


def test_a_cell_recorded_as_two_rows_counts_once_in_the_runs_median() -> None:
    fits, outgrows = Cell(WorkloadKind.CHAT, True, 1), Cell(WorkloadKind.CHAT, False, 1)
    big = _measured(fits, ColumnKind.PLAIN, 0, 100.0)
    measured = (
        big,  # the big server's one cell: plain's "fits" row and the ideal's "outgrows" row (its outcomes)
        dataclasses.replace(big, cell=outgrows, column=ColumnKind.IDEAL),
        _measured(outgrows, ColumnKind.PLAIN, 0, 200.0),
        _measured(outgrows, ColumnKind.TIERCACHE_L2, 0, 300.0),
    )
    workload = build(WorkloadKind.CHAT, 2048, 0, 4)
    result = ServeResult(measured, {}, {}, {fits: workload, outgrows: workload}, None, 10.0)
    by = {(r["fits"], r["column"]): r for r in rows(result)}
    # three probes (100, 200, 300): the median is 200, not 150 (100 counted twice)
    assert abs(by[(False, "plain")]["host_vs_run"] - 1.0) < 1e-9
    assert abs(by[(True, "plain")]["host_vs_run"] - 0.5) < 1e-9


def test_vllms_request_timings_become_means_per_request() -> None:
    cell = Cell(WorkloadKind.CHAT, False, 8)
    engine = {
        "request_queue_time_seconds_sum": 2.0,
        "request_queue_time_seconds_count": 4.0,
        "request_prefill_time_seconds_sum": 0.2,
        "request_prefill_time_seconds_count": 4.0,
        "num_preemptions_total": 3.0,
    }
    measured = dataclasses.replace(_measured(cell, ColumnKind.PLAIN, 0, None), engine=engine)
    result = ServeResult((measured,), {}, {}, {cell: build(WorkloadKind.CHAT, 2048, 0, 4)}, None, 1.0)
    (row,) = rows(result)
    assert row["queue_ms_mean"] == 500.0 and row["prefill_ms_mean"] == 50.0 and row["preemptions"] == 3
    assert "engine chat outgrows c=8 plain: requests queued 500.0 ms" in format_table(result)
    (quiet,) = rows(dataclasses.replace(result, measured=(_measured(cell, ColumnKind.PLAIN, 0, None),)))
    assert quiet["queue_ms_mean"] is None and quiet["preemptions"] == 0

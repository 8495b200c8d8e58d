"""Engines SIGKILLed while holding a load lease, a half-written store ticket, a prefill claim and a
layerwise save (real engine and daemon processes, short lifetimes): everything drains, nothing
half-written is visible, and the prompts can be stored and loaded again bit for bit.

The work is :func:`tiercache.testing.faults.engines.run_engine_kills` (what ``tiercache-bench faults``
reports); this test asserts on its figures.
"""

from __future__ import annotations

from pathlib import Path

from tiercache.testing.faults.engines import HOLDS, EngineKillConfig, run_engine_kills


def test_engines_killed_holding_things_drain_and_leave_nothing_half_written(tmp_path: Path) -> None:
    report = run_engine_kills(EngineKillConfig(work_dir=tmp_path))
    assert report.engines_killed == len(HOLDS)
    assert all(report.held[kind] > 0 for kind in HOLDS), report.held  # each engine held something
    assert report.drained
    assert report.half_written_visible == 0
    assert report.restored_exact

"""Corrupted L3 values (bit flips, truncations, values swapped between keys), injected with py-lmdb while
the daemon is stopped: every one detected by the restarted daemon, each a counted miss, no wrong byte.

The work is :func:`tiercache.testing.faults.corrupt.run_corruption` (what ``tiercache-bench faults``
reports); this test asserts on its figures.
"""

from __future__ import annotations

from pathlib import Path

from tiercache.testing.faults.corrupt import KINDS, CorruptConfig, run_corruption


def test_every_corrupted_value_is_detected_and_counted(tmp_path: Path) -> None:
    report = run_corruption(CorruptConfig(work_dir=tmp_path, prompts=16, injections=12, seed=3))
    assert report.injected == 12
    assert all(report.by_kind[kind] > 0 for kind in KINDS)  # every kind of damage was dealt
    assert report.detected == report.injected  # 100 %, each counted once
    assert report.served_damaged == 0
    assert report.wrong_loads == 0

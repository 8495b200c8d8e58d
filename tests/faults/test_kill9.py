"""Kill -9 of the daemon in the middle of stores, 20 times in a row on one L3 (real daemon processes).

The work is :func:`tiercache.testing.faults.kill.run_kills` (what ``tiercache-bench faults`` reports); this
test asserts on its figures: no wrong byte ever served after a restart, nothing L3 held before a kill
missing after it, the environment never moved aside, and the write-down backlog lost at a kill within
what the volatile tiers hold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.testing.faults.kill import KillConfig, run_kills

KILLS = 20


@pytest.mark.slow
def test_twenty_kills_mid_store_serve_nothing_wrong_and_keep_l3(tmp_path: Path) -> None:
    report = run_kills(KillConfig(work_dir=tmp_path, kills=KILLS, prompts_per_round=3, stores_before_kill=2))
    assert report.kills == KILLS and report.restarts == KILLS
    assert report.prompts_acknowledged >= KILLS * 3  # the scenario happened: stores were acknowledged
    assert report.loads_checked > 0 and report.l3_chunks_checked > 0
    assert report.torn_served == 0
    assert report.l3_chunks_lost == 0
    assert report.moved_aside == 0
    assert report.backlog_lost_max <= report.backlog_bound

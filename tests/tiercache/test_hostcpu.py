"""The host's idle cores from /proc/stat: idle and iowait over all counted time, times the CPUs."""

from __future__ import annotations

import os
from pathlib import Path

from tiercache.hostcpu import IdleCores


def _stat(path: Path, idle: int, busy: int, cpus: int = 4) -> None:
    """A /proc/stat of ``cpus`` CPUs whose summed line has ``busy`` jiffies of work and ``idle`` idle."""
    head = f"cpu  {busy} 0 0 {idle - 10} 10 0 0 0 0 0"
    lines = [head] + [f"cpu{i} 1 0 0 1 0 0 0 0 0 0" for i in range(cpus)] + ["intr 1 2 3", "ctxt 99"]
    path.write_text("\n".join(lines) + "\n")


def test_idle_cores_are_the_idle_share_of_the_time_counted_times_the_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, idle=1000, busy=1000)
    idle = IdleCores(stat)
    _stat(stat, idle=1300, busy=1100)  # 400 jiffies passed on 4 CPUs, 300 of them idle (iowait included)
    assert idle() == 3.0
    _stat(stat, idle=1300, busy=1500)  # every CPU busy since
    assert idle() == 0.0
    assert idle() == 0.0  # no time counted since the last reading


def test_an_unreadable_or_foreign_stat_file_counts_no_core_idle(tmp_path: Path) -> None:
    missing = IdleCores(tmp_path / "absent")
    assert missing() == 0.0
    odd = tmp_path / "stat"
    odd.write_text("something else\n")
    assert IdleCores(odd)() == 0.0


def test_the_real_host_reads_between_none_and_all_of_its_cores() -> None:
    idle = IdleCores()
    sum(range(200_000))  # some time passes
    cores = idle()
    assert 0.0 <= cores <= (os.cpu_count() or 1) + 1e-9

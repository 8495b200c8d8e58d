"""How many of the host's cores sat idle: the measure of when background work may run without costing anyone.

Deferred work (the write-downs a ``watermark`` write policy kept above while the fast tier had room) should
run only on CPU the serving processes leave: on a small host vLLM's engine and worker busy-poll every core,
and any CPU taken from them comes out of the next step. Linux counts every CPU's idle time in ``/proc/stat``;
the share of it over an interval, times the number of CPUs, is the number of cores nothing ran on. It is
the whole host's view: a CPU quota set by a container's cgroup is not in it.

Primitives:
    IdleCores: the idle cores of the host since the previous reading.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

_IDLE_FIELDS = (3, 4)
"""The fields of a ``/proc/stat`` cpu line that count as idle: idle and iowait (0-based, after the name)."""

_COUNTED_FIELDS = 8
"""user, nice, system, idle, iowait, irq, softirq, steal (guest time is counted inside user already)."""


class IdleCores:
    """Reads ``/proc/stat`` and tells how many cores were idle between two readings (0 where it is absent)."""

    def __init__(self, path: Path = Path("/proc/stat")) -> None:
        """Args: path: the kernel's CPU statistics (a file of that format, for tests)."""
        self._path = path
        self._last = self._read()

    def __call__(self) -> float:
        """Idle cores, on average, since the previous call (or since construction)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return 0.0
        cpus, total, idle = now
        d_total, d_idle = total - last[1], idle - last[2]
        if d_total <= 0:
            return 0.0
        return cpus * max(0, d_idle) / d_total

    def _read(self) -> tuple[int, int, int] | None:
        """(CPUs, all counted jiffies, idle jiffies) summed over the CPUs, or None where unreadable."""
        try:
            lines = self._path.read_text().splitlines()
        except OSError as exc:
            logger.debug("cannot read %s (%s): no core counts as idle", self._path, exc)
            return None
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        head = lines[0].split() if lines else []
        if not head or head[0] != "cpu" or cpus == 0:
            return None
        try:
            fields = [int(v) for v in head[1 : 1 + _COUNTED_FIELDS]]
        except ValueError:
            return None
        return cpus, sum(fields), sum(fields[i] for i in _IDLE_FIELDS if i < len(fields))

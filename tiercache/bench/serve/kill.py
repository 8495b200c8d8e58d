"""``--kill-daemon-at``: SIGKILL the daemon under a running ``vllm serve`` column, restart it, and report.

Primitives:
    Killer: the timer thread that kills and restarts the daemon.
    KillReport: what the kill did.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from tiercache.testing.daemon import DaemonProcess, DaemonStartError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KillReport:
    """What ``--kill-daemon-at`` did.

    Attributes:
        column: the column whose daemon was killed.
        killed_at_s / restarted_at_s: seconds into the column.
        failed_requests: requests of that column's cells that failed.
        hit_tokens_after: tokens the restarted daemon served (its own counters: all after the restart), the
            probe included.
        probe_requests / probe_failed / probe_connector_tokens: after the cells and the restart, the largest
            workload's first turns again (``run._probe``): how many, how many failed, and the prompt tokens
            vLLM got from the connector for them.
        error: what did not go as asked ("" when the kill came on time and the restart worked).
    """

    column: str
    killed_at_s: float
    restarted_at_s: float
    failed_requests: int
    hit_tokens_after: int
    probe_requests: int
    probe_failed: int
    probe_connector_tokens: int
    error: str = ""


class Killer:
    """Kills the daemon ``at_s`` after :meth:`arm` (or when the column ends, if that comes first), restarts it
    after ``pause_s`` (a timer thread)."""

    def __init__(self, daemon: DaemonProcess, at_s: float, pause_s: float) -> None:
        self.daemon, self.at_s, self.pause_s = daemon, at_s, pause_s
        self.killed_at = self.restarted_at = -1.0
        self.error = ""
        self._t0 = 0.0
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serve-daemon-killer", daemon=True)

    def arm(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        if self._ended.wait(self.at_s):
            self.error = "the column's cells ended before the kill was due: killed after them"
        self.daemon.kill()
        self.killed_at = time.monotonic() - self._t0
        logger.info("daemon SIGKILLed %.1f s into the column", self.killed_at)
        self._ended.wait(self.pause_s)
        try:
            self.daemon.start()
        except DaemonStartError as exc:
            self.error = f"restart failed: {exc}"
            return
        self.restarted_at = time.monotonic() - self._t0
        logger.info("daemon restarted %.1f s into the column", self.restarted_at)

    def finish(self) -> None:
        """The column's cells ended: kill now if the kill is not done yet, and wait for the restart."""
        self._ended.set()
        self._thread.join()

    def restarted_between(self, t0: float, t1: float) -> bool:
        return self.killed_at >= 0 and t0 - self._t0 <= self.killed_at <= t1 - self._t0

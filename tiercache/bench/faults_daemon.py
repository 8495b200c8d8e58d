"""A daemon process the fault benchmarks can kill: started on a given L3, stopped gently or with SIGKILL,
and measured from ``/proc`` (resident memory, open file descriptors, threads, shared-memory segments).

Unlike :func:`~tiercache.bench.daemon_proc.start_daemon` (one daemon per run, always stopped gently), a
:class:`KillableDaemon` is one of a series on the same L3 directory: the fault runs kill it in the middle of
stores and start the next one on what it left.

Primitives:
    ProcessFootprint: RSS, open fds, threads and shared-memory segments of a process at one moment.
    footprint: the footprint of a process by pid.
    KillableDaemon: ``start``, ``kill`` (SIGKILL), ``stop`` (SIGTERM), ``footprint``, ``log_tail``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tiercache.shm import SHM_DIR

from .daemon_proc import EmbeddedDaemonConfig, wait_serving

_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True, slots=True)
class ProcessFootprint:
    """What a process holds at one moment.

    Attributes:
        rss_bytes: resident memory.
        fds: open file descriptors.
        threads: threads.
        segments: shared-memory segments of its prefix under ``/dev/shm``.
    """

    rss_bytes: int
    fds: int
    threads: int
    segments: int


def footprint(pid: int, shm_prefix: str) -> ProcessFootprint:
    """The footprint of process ``pid`` (Linux ``/proc``); segments counted by name prefix."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    segments = len(list(SHM_DIR.glob(f"{shm_prefix}.*")))
    return ProcessFootprint(rss, fds, threads, segments)


class KillableDaemon:
    """One ``tiercache.daemon`` process on a given L3 directory and socket."""

    def __init__(self, config: EmbeddedDaemonConfig, work_dir: Path, l3_dir: Path, socket: Path) -> None:
        """Args: config: sizes and policies; work_dir: where its log goes; l3_dir: its L3 (shared by a
        series of daemons); socket: its unix socket (short path)."""
        self._config = config
        self._work_dir = work_dir
        self._l3_dir = l3_dir
        self._socket = socket
        self.shm_prefix = f"tiercache-faults-{secrets.token_hex(4)}"
        self.log = work_dir / f"daemon-{self.shm_prefix}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """What a client dials."""
        return f"unix:{self._socket}"

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    def start(self) -> None:
        """Start the process and wait (bounded) until it answers.

        Raises:
            DaemonStartError: it exited or did not answer in time.
        """
        argv = self._config.argv(self._socket, self._l3_dir, self.shm_prefix)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_serving(self._proc, self.address, self.log, self._config.start_timeout_s)
        except BaseException:
            self.kill()
            raise

    def alive(self) -> bool:
        """Whether the process is running."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and reap it; unlink the segments it can no longer unlink itself."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(self._config.stop_timeout_s)
        self._unlink_segments()

    def stop(self) -> int:
        """SIGTERM and wait; SIGKILL after the stop timeout. Returns the exit status."""
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(self._config.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(self._config.stop_timeout_s)
        self._unlink_segments()
        return int(self._proc.returncode)

    def footprint(self) -> ProcessFootprint:
        """The running process's footprint."""
        return footprint(self.pid, self.shm_prefix)

    def log_tail(self) -> str:
        """The end of the process's log."""
        try:
            return self.log.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def _unlink_segments(self) -> None:
        for path in SHM_DIR.glob(f"{self.shm_prefix}.*"):
            path.unlink(missing_ok=True)

"""A ``tiercache.daemon`` process for tests, benches and fault runs: started, stopped, killed, restarted.

A :class:`DaemonProcess` is one daemon's socket, shared-memory prefix and options (its L3 among them), run
as a process any number of times: ``start`` runs it and waits (bounded) until its health service says
SERVING, ``stop`` signals it (SIGTERM, SIGKILL after a bounded wait), ``kill`` is SIGKILL (what a crash
leaves, less the shared memory), ``restart`` starts it again on the same socket, prefix and L3, and
``cleanup`` stops it and unlinks its segments and socket. Spawning, waiting and stopping are
:class:`~tiercache.connector.local_daemon.LocalDaemon`'s (the one way of running a daemon process, which the
connector's demo needs too). The environment is this process's without any ``TIERCACHE_*`` variable (plus
what the caller adds), so that a developer's settings never reach a test daemon. Each start logs to its own
file under ``root``; a start that fails raises with the tail of that log.

Primitives:
    START_TIMEOUT_S / STOP_TIMEOUT_S: the bounds of a start and of a stop.
    DaemonStartError: the daemon exited or did not serve in time.
    hermetic_env: this process's environment without ``TIERCACHE_*``, plus overrides.
    free_port: a loopback TCP port that was free a moment ago.
    ProcessFootprint / footprint: RSS, open fds, threads and shared-memory segments of a process.
    DaemonProcess: the daemon process.
"""

from __future__ import annotations

import os
import signal
import socket as socketlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from tiercache.connector.local_daemon import DaemonStartError, LocalDaemon
from tiercache.proto import tiercache_pb2_grpc as pb_grpc
from tiercache.shm import SHM_DIR

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_CHANNEL_MESSAGE_BYTES = 64 << 20

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "DaemonProcess",
    "DaemonStartError",
    "ProcessFootprint",
    "footprint",
    "free_port",
    "hermetic_env",
]


def hermetic_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``TIERCACHE_*`` variables, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    return {**env, **(extra or {})}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class DaemonProcess:
    """One daemon (socket, shared-memory prefix, options), run as a process any number of times.

    Attributes:
        root: where its logs go (and its socket, unless given).
        socket: its unix socket.
        prefix: its L2 segments' name prefix.
        args: its options (``--l2-prefix`` first, then the caller's; ``--socket`` is added at start).
        env: its environment.
        starts: how many times it was started.
    """

    def __init__(
        self,
        root: Path,
        args: Sequence[str] = (),
        *,
        prefix: str,
        socket: Path | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        """Args: root: an existing or creatable directory; args: daemon flags (``--l3-path`` and sizes);
        prefix: the L2 prefix (unique per daemon); socket: its unix socket (``root/d.sock``; a socket path
        has ~107 bytes); env: added to :func:`hermetic_env`; the timeouts of a start and a stop."""
        self.root = root
        self.socket = socket if socket is not None else root / "d.sock"
        self.prefix = prefix
        self.args = ["--l2-prefix", prefix, *args]
        self.env = hermetic_env(env)
        self.starts = 0
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._local: LocalDaemon | None = None
        self._channels: list[grpc.Channel] = []

    @property
    def address(self) -> str:
        """What a client dials."""
        return f"unix:{self.socket}"

    @property
    def argv(self) -> list[str]:
        """Its whole command line."""
        return [sys.executable, "-m", "tiercache.daemon", "--socket", str(self.socket), *self.args]

    @property
    def log(self) -> Path:
        """The log (stdout and stderr) of its latest start."""
        return self.root / f"{self.prefix}-{self.starts}.log"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The process of its latest start (None before the first)."""
        return self._local.proc if self._local is not None else None

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self._local is not None, "not started"
        return self._local.proc.pid

    def alive(self) -> bool:
        """Whether its process runs."""
        return self._local is not None and self._local.proc.poll() is None

    def start(self) -> DaemonProcess:
        """Start the process and wait (bounded) until it serves; returns self.

        Raises:
            DaemonStartError: it exited or did not serve in time (with the tail of its log).
        """
        assert not self.alive(), "already running"
        self.starts += 1
        self.root.mkdir(parents=True, exist_ok=True)
        self._local = LocalDaemon.start(self.socket, self.args, self.log, self._start_timeout_s, self.env)
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Close the channels it handed out, send ``sig``, SIGKILL after the stop timeout; its exit status
        (0 when it never ran)."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._local is None:
            return 0
        return self._local.stop(sig, self._stop_timeout_s)

    def terminate(self) -> int:
        """SIGTERM and reap: its exit status (0 when it drained cleanly)."""
        return self.stop(signal.SIGTERM)

    def kill(self) -> int:
        """SIGKILL and reap; unlink the segments it can no longer unlink itself (the socket stays, as a
        crash leaves it). Its exit status."""
        code = self.stop(signal.SIGKILL)
        self._unlink_segments()
        return code

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> DaemonProcess:
        """Stop it with ``sig`` and start it again on the same socket, prefix and L3."""
        self.stop(sig)
        return self.start()

    def cleanup(self) -> None:
        """Stop it and remove what it left: segments of its prefix and its socket."""
        self.stop()
        self._unlink_segments()
        self.socket.unlink(missing_ok=True)

    def segments(self) -> list[Path]:
        """Shared-memory segments of its prefix."""
        return sorted(SHM_DIR.glob(f"{self.prefix}.*"))

    def _unlink_segments(self) -> None:
        for path in self.segments():
            path.unlink(missing_ok=True)

    def stderr(self) -> str:
        """What its latest start logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        """The end of its latest log."""
        return self.stderr()[-chars:] or "(no log)"

    def footprint(self) -> ProcessFootprint:
        """The running process's footprint."""
        return footprint(self.pid, self.prefix)

    def channel(self) -> grpc.Channel:
        """A new gRPC channel to its socket (64 MiB messages; closed when it stops)."""
        limit = _CHANNEL_MESSAGE_BYTES
        ch = grpc.insecure_channel(
            self.address,
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
        )
        self._channels.append(ch)
        return ch

    def stub(self) -> pb_grpc.KVCacheServiceStub:
        """A KVCacheService stub on a new channel."""
        return pb_grpc.KVCacheServiceStub(self.channel())

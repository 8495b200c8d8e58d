"""A local ``tiercache.daemon`` subprocess for demos and benchmarks: reuse one that answers, else start one.

The daemon is started as ``python -m tiercache.daemon`` (never imported: the connector does not depend on
the daemon package) and stopped with SIGTERM (SIGKILL after a bounded wait) by whoever started it.

Primitives:
    default_socket: the daemon's default socket path (``$TIERCACHE_SOCKET``, ``$XDG_RUNTIME_DIR``, ``/tmp``).
    answers: whether a daemon answers at an address.
    LocalDaemon: a started daemon process (``stop``).
    ensure_daemon: a context manager yielding the address, starting (and later stopping) a daemon if needed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tiercache.errors import TierCacheError, UnavailableError

from .client import TierCacheClient
from .connection import ClientConfig

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def default_socket(env: Mapping[str, str] | None = None) -> str:
    """``$TIERCACHE_SOCKET``, else ``$XDG_RUNTIME_DIR/tiercache/daemon.sock``, else ``/tmp/tiercache-<uid>/...``."""
    env = os.environ if env is None else env
    if env.get("TIERCACHE_SOCKET"):
        return env["TIERCACHE_SOCKET"]
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "tiercache" / "daemon.sock")
    return f"/tmp/tiercache-{os.getuid()}/daemon.sock"


def answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a daemon at ``address`` answers a Stats call within ``timeout_s``."""
    path = address.removeprefix("unix:") if address.startswith(("unix:", "/")) else None
    if path is not None and not Path(path).exists():
        return False  # no socket file: nobody listens (and no failed call to log)
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=timeout_s))
    try:
        client.stats()
        return True
    except TierCacheError:
        return False
    finally:
        client.close()


@dataclass(frozen=True, slots=True)
class LocalDaemon:
    """A daemon process this process started.

    Attributes:
        proc: the process.
        address: its client address (``unix:<socket>``).
        log_path: its stdout and stderr.
    """

    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path

    @classmethod
    def start(
        cls,
        socket: str,
        args: Sequence[str] = (),
        log_path: Path | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> LocalDaemon:
        """Start ``python -m tiercache.daemon --socket SOCKET ARGS...`` and wait until it answers.

        Raises:
            UnavailableError: it exited or did not answer within ``timeout_s`` (the message holds its log).
        """
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tiercache-daemon-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        cmd = [sys.executable, "-m", "tiercache.daemon", "--socket", socket, *args]
        logger.info("starting %s", " ".join(cmd))
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        daemon = cls(proc, f"unix:{socket}", log_path)
        try:
            daemon._wait_until_serving(timeout_s)
        except BaseException:
            daemon.stop()
            raise
        return daemon

    def _wait_until_serving(self, timeout_s: float) -> None:
        client = TierCacheClient.connect(self.address, config=ClientConfig(timeout_s=2.0))
        try:
            deadline = time.monotonic() + timeout_s
            while (remaining := deadline - time.monotonic()) > 0:
                if self.proc.poll() is not None:
                    raise UnavailableError(f"daemon exited with {self.proc.returncode}: {self._log_tail()}")
                # Blocks on the channel's readiness (no polling of the socket); then the first real call.
                if client.wait_ready(min(0.5, remaining)) and answers(self.address):
                    return
                if self.proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(0.05)  # a bounded wait on the process, not a sleep
            raise UnavailableError(f"daemon did not answer within {timeout_s}s: {self._log_tail()}")
        finally:
            client.close()

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> int:
        """SIGTERM (the daemon drains and unlinks its shared memory), SIGKILL after a bounded wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("daemon %d did not stop in %.0fs; killing it", self.proc.pid, STOP_TIMEOUT_S)
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        return int(self.proc.returncode)


@contextlib.contextmanager
def ensure_daemon(
    socket: str, args: Sequence[str] = (), log_path: Path | None = None
) -> Iterator[LocalDaemon | None]:
    """Yield None when a daemon answers on ``socket``; else start one with ``args``, yield it, stop it at exit."""
    if answers(f"unix:{socket}"):
        logger.info("using the daemon on %s", socket)
        yield None
        return
    daemon = LocalDaemon.start(socket, args, log_path)
    try:
        yield daemon
    finally:
        code = daemon.stop()
        logger.info("stopped the daemon this process started (exit %d)", code)

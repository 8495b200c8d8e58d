"""A local ``tiercache.daemon`` subprocess: reuse one that answers, else start one and stop it at exit.

``tiercache-model-demo`` starts a daemon when none runs, and the connector must not import
``tiercache.testing``; so the one way of running a daemon process lives here, and the process harness of the
tests and benches (:mod:`tiercache.testing.daemon`) builds on :class:`LocalDaemon`. The daemon is started as
``python -m tiercache.daemon`` (never imported: the connector does not depend on the daemon package), is
waited for until its gRPC health service says SERVING (set once every listener and the control socket are
up), and is stopped with SIGTERM (SIGKILL after a bounded wait).

Primitives:
    default_socket: the daemon's default socket path (``$TIERCACHE_SOCKET``, ``$XDG_RUNTIME_DIR``, ``/tmp``).
    answers: whether a daemon answers at an address.
    serving: whether the health service at a unix socket says SERVING.
    DaemonStartError: a started daemon exited or did not serve in time (the message holds its log's tail).
    LocalDaemon: a started daemon process (``start``, ``stop``, ``log_tail``).
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

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiercache.errors import TierCacheError, UnavailableError

from .client import TierCacheClient
from .connection import ClientConfig

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.05
"""Pause between readiness probes: a bounded wait on the process, so that an early exit ends it at once."""
_LOG_TAIL_CHARS = 4000


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


def serving(socket: str | Path, timeout_s: float = 1.0) -> bool:
    """Whether a daemon's health service on unix socket ``socket`` says SERVING (health needs no token)."""
    if not os.path.exists(socket):
        return False
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


class DaemonStartError(UnavailableError):
    """A started daemon exited early or did not serve in time."""


@dataclass(frozen=True, slots=True)
class LocalDaemon:
    """A daemon process this process started.

    Attributes:
        proc: the process.
        socket: its unix socket.
        log_path: its stdout and stderr.
    """

    proc: subprocess.Popen[bytes]
    socket: Path
    log_path: Path

    @property
    def address(self) -> str:
        """Its client address (``unix:<socket>``)."""
        return f"unix:{self.socket}"

    @classmethod
    def start(
        cls,
        socket: str | Path,
        args: Sequence[str] = (),
        log_path: Path | None = None,
        timeout_s: float = START_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> LocalDaemon:
        """Start ``python -m tiercache.daemon --socket SOCKET ARGS...`` and wait until it serves.

        Args:
            socket: the unix socket it listens on.
            args: further daemon flags.
            log_path: where its stdout and stderr go (a temporary file if None).
            timeout_s: how long it may take to serve.
            env: its environment (None: this process's).

        Raises:
            DaemonStartError: it exited or did not serve within ``timeout_s`` (the message holds its log).
        """
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tiercache-daemon-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        cmd = [sys.executable, "-m", "tiercache.daemon", "--socket", str(socket), *args]
        logger.info("starting %s", " ".join(cmd))
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env)
            )
        daemon = cls(proc, Path(socket), log_path)
        try:
            daemon._wait_until_serving(timeout_s)
        except BaseException:
            daemon.stop()
            raise
        return daemon

    def _wait_until_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                code: int | None = self.proc.wait(_POLL_S)  # the pause between probes
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                raise DaemonStartError(f"daemon exited with {code}:\n{self.log_tail()}")
            if serving(self.socket, min(1.0, max(deadline - time.monotonic(), 0.1))):
                return
            if time.monotonic() > deadline:
                raise DaemonStartError(f"daemon did not serve within {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The end of its log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send ``sig`` (SIGTERM: the daemon drains and unlinks its shared memory), SIGKILL after
        ``timeout_s``; reap it and return its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("daemon %d did not stop in %.0fs; killing it", self.proc.pid, timeout_s)
                self.proc.kill()
                self.proc.wait(timeout_s)
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

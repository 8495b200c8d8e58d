"""A daemon for one benchmark run: a running one (``--address``), or a ``tiercache.daemon`` process the bench
starts on a temporary unix socket and stops at exit.

The started daemon runs ``python -m tiercache.daemon`` with explicit, modest sizes (never the host-derived
defaults), its own shared-memory prefix, its socket in a short temporary directory, its L3 (if any) in the run's work directory and no
``TIERCACHE_*`` environment; it is stopped with SIGTERM (SIGKILL after a bounded wait) and any segment it
left is unlinked.

Primitives:
    EmbeddedDaemonConfig: sizes and policies of a started daemon.
    DaemonHandle: the address to use and how the daemon came to be.
    DaemonStartError: the daemon exited or did not answer in time (the message carries its log's tail).
    wait_serving: wait (bounded) until a started daemon process answers.
    start_daemon: context manager running an embedded daemon.
    use_daemon: the given address, or an embedded daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tiercache.connector import ClientConfig, TierCacheClient
from tiercache.errors import TierCacheError
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.shm import SHM_DIR

logger = logging.getLogger(__name__)

_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True, slots=True)
class EmbeddedDaemonConfig:
    """Sizes and policies of a daemon started by the bench.

    Attributes:
        slot_bytes: L1/L2 slot size (the largest chunk it accepts).
        l1_device: ``none``, ``cpu``, ``cuda[:n]`` or ``auto``.
        l1_bytes: L1 capacity (ignored with ``none``).
        l2_bytes: L2 (shared-memory) capacity; at least one slot.
        l3_bytes: L3 capacity in the work directory; 0 for no L3.
        write_policy: when chunks are written down.
        eviction_policy: which chunk goes first.
        lease_ttl_s: lifetime of leases and tickets.
        max_ttl_s: the longest lifetime a request may ask for (at least ``lease_ttl_s``).
        max_message_bytes: largest gRPC message.
        start_timeout_s: how long to wait for the daemon to answer.
        stop_timeout_s: how long to wait for it to exit after SIGTERM.
    """

    slot_bytes: int = 32 << 20
    l1_device: str = "none"
    l1_bytes: int = 256 << 20
    l2_bytes: int = 1 << 30
    l3_bytes: int = 0
    write_policy: WritePolicyKind = WritePolicyKind.WRITE_THROUGH
    eviction_policy: EvictionPolicyKind = EvictionPolicyKind.ADAPTIVE
    lease_ttl_s: float = 30.0
    max_ttl_s: float = 300.0
    max_message_bytes: int = 8 << 20
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.slot_bytes <= 0 or self.l2_bytes < self.slot_bytes:
            raise ValueError(f"l2_bytes ({self.l2_bytes}) must hold one slot of {self.slot_bytes} bytes")
        if self.l3_bytes < 0 or self.l1_bytes <= 0:
            raise ValueError("l1_bytes must be positive and l3_bytes non-negative")
        if self.max_ttl_s < self.lease_ttl_s:
            raise ValueError(
                f"max_ttl_s ({self.max_ttl_s}) must be at least lease_ttl_s ({self.lease_ttl_s})"
            )

    def argv(self, socket: Path, l3_dir: Path, shm_prefix: str) -> list[str]:
        """The daemon's command line."""
        l1 = ["--l1-device", self.l1_device]
        if self.l1_device != "none":
            l1 += ["--l1-bytes", str(max(self.l1_bytes, self.slot_bytes))]
        return [
            sys.executable, "-m", "tiercache.daemon",
            "--socket", str(socket),
            "--slot-bytes", str(self.slot_bytes),
            *l1,
            "--l2-bytes", str(self.l2_bytes),
            "--l2-prefix", shm_prefix,
            "--l3-path", str(l3_dir) if self.l3_bytes else "",
            *(["--l3-bytes", str(self.l3_bytes)] if self.l3_bytes else []),
            "--write-policy", self.write_policy.value,
            "--eviction-policy", self.eviction_policy.value,
            "--lease-ttl-s", str(self.lease_ttl_s),
            "--max-ttl-s", str(self.max_ttl_s),
            "--max-message-bytes", str(self.max_message_bytes),
            "--log-level", "WARNING",
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class DaemonHandle:
    """The daemon of a run.

    Attributes:
        address: what the connector dials.
        token: bearer token, if any.
        embedded: True when the bench started it.
        argv: the command line of an embedded daemon (empty otherwise).
    """

    address: str
    token: str | None
    embedded: bool
    argv: tuple[str, ...] = ()


class DaemonStartError(RuntimeError):
    """An embedded daemon exited early or did not answer in time."""


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"


def wait_serving(proc: subprocess.Popen[bytes], address: str, log: Path, timeout_s: float) -> None:
    """Wait until the daemon ``proc`` answers a Stats call at ``address``.

    Raises:
        DaemonStartError: it exited, or did not answer within ``timeout_s`` (with the tail of ``log``).
    """
    deadline = time.monotonic() + timeout_s
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=2.0))
    try:
        while True:
            if proc.poll() is not None:
                raise DaemonStartError(f"daemon exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise DaemonStartError(f"daemon did not answer within {timeout_s:.0f}s:\n{_tail(log)}")
            if client.wait_ready(0.5):
                try:
                    client.stats()
                    return
                except TierCacheError:
                    time.sleep(0.05)  # the socket exists but the server is not serving yet
    finally:
        client.close()


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("daemon %d did not exit after SIGTERM; killing it", proc.pid)
            proc.kill()
            proc.wait(timeout_s)


@contextlib.contextmanager
def start_daemon(config: EmbeddedDaemonConfig, work_dir: Path) -> Iterator[DaemonHandle]:
    """Run a daemon on a socket in a short temporary directory for the duration of the ``with`` block.

    Args:
        config: sizes and policies.
        work_dir: an existing directory the run owns (L3, log).

    Raises:
        DaemonStartError: it exited or did not answer within ``config.start_timeout_s``.
    """
    sock_dir = Path(tempfile.mkdtemp(prefix="tcbench-"))  # short: a unix socket path has ~107 bytes
    socket = sock_dir / "daemon.sock"
    log = work_dir / "daemon.log"
    prefix = f"tiercache-bench-{secrets.token_hex(4)}"
    argv = config.argv(socket, work_dir / "daemon-l3", prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    logger.info("starting a daemon: %s", " ".join(argv[1:]))
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        address = f"unix:{socket}"
        wait_serving(proc, address, log, config.start_timeout_s)
        yield DaemonHandle(address, None, True, tuple(argv))
    finally:
        _stop(proc, config.stop_timeout_s)
        for path in SHM_DIR.glob(f"{prefix}*"):
            path.unlink(missing_ok=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
        if proc.returncode not in (0, None, -signal.SIGTERM):
            logger.warning("daemon exited with %s:\n%s", proc.returncode, _tail(log))


@contextlib.contextmanager
def use_daemon(
    address: str | None, token: str | None, config: EmbeddedDaemonConfig, work_dir: Path
) -> Iterator[DaemonHandle]:
    """``address`` when given (nothing is started), else an embedded daemon (see :func:`start_daemon`)."""
    if address is not None:
        yield DaemonHandle(address, token, False)
        return
    with start_daemon(config, work_dir) as handle:
        yield handle

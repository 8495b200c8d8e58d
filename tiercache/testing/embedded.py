"""A daemon for one benchmark or fault run: a running one (``--address``), or a daemon process started with
explicit, modest sizes (never the host-derived defaults) and stopped at exit.

A started daemon gets its own shared-memory prefix, its socket in a short temporary directory, its L3 (if
any) in the run's work directory and no ``TIERCACHE_*`` environment (see :class:`~.daemon.DaemonProcess`);
at exit it is stopped and what it left is unlinked.

Primitives:
    EmbeddedDaemonConfig: sizes and policies of a started daemon (its ``options``).
    DaemonHandle: the address to use and how the daemon came to be.
    daemon_process: a (not yet started) daemon process of a config, on a given L3 and socket.
    start_daemon: context manager running an embedded daemon.
    use_daemon: the given address, or an embedded daemon.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tiercache.policies import EvictionPolicyKind, WritePolicyKind

from .daemon import DaemonProcess

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmbeddedDaemonConfig:
    """Sizes and policies of a daemon started by a run.

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

    def options(self, l3_dir: Path) -> list[str]:
        """The daemon's flags (its socket and L2 prefix aside)."""
        l1 = ["--l1-device", self.l1_device]
        if self.l1_device != "none":
            l1 += ["--l1-bytes", str(max(self.l1_bytes, self.slot_bytes))]
        return [
            "--slot-bytes", str(self.slot_bytes),
            *l1,
            "--l2-bytes", str(self.l2_bytes),
            "--l3-path", str(l3_dir) if self.l3_bytes else "",
            *(["--l3-bytes", str(self.l3_bytes)] if self.l3_bytes else []),
            "--write-policy", self.write_policy.value,
            "--eviction-policy", self.eviction_policy.value,
            "--lease-ttl-s", str(self.lease_ttl_s),
            "--max-ttl-s", str(self.max_ttl_s),
            "--max-message-bytes", str(self.max_message_bytes),
            "--log-level", "WARNING",
            "--diagnostics",  # the echo baselines the benchmarks measure against
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class DaemonHandle:
    """The daemon of a run.

    Attributes:
        address: what the connector dials.
        token: bearer token, if any.
        embedded: True when the run started it.
        argv: the command line of an embedded daemon (empty otherwise).
    """

    address: str
    token: str | None
    embedded: bool
    argv: tuple[str, ...] = ()


def daemon_process(
    config: EmbeddedDaemonConfig, log_dir: Path, l3_dir: Path, socket: Path, label: str = "bench"
) -> DaemonProcess:
    """A daemon process of ``config`` (not started): logs in ``log_dir``, L3 in ``l3_dir`` (a series of
    daemons may share one), a fresh L2 prefix ``tiercache-<label>-<random>``."""
    return DaemonProcess(
        log_dir,
        config.options(l3_dir),
        prefix=f"tiercache-{label}-{secrets.token_hex(4)}",
        socket=socket,
        start_timeout_s=config.start_timeout_s,
        stop_timeout_s=config.stop_timeout_s,
    )


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
    daemon = daemon_process(config, work_dir, work_dir / "daemon-l3", sock_dir / "daemon.sock")
    logger.info("starting a daemon: %s", " ".join(daemon.argv[1:]))
    try:
        daemon.start()
        yield DaemonHandle(daemon.address, None, True, tuple(daemon.argv))
    finally:
        daemon.cleanup()
        shutil.rmtree(sock_dir, ignore_errors=True)
        code = daemon.proc.returncode if daemon.proc is not None else None
        if code not in (0, None, -signal.SIGTERM):
            logger.warning("daemon exited with %s:\n%s", code, daemon.log_tail())


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

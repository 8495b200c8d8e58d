"""Real ``tiercache-daemon`` processes standing in for two hosts (own socket, L2 segment, L3 directory) on
one shared store: started by :class:`Hosts`, waited for until the health check says SERVING, stopped and
cleaned up after. Imported by path from ``conftest.py`` (test modules are not importable here)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiercache.shm import SHM_DIR

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Host:
    """One daemon process (a host of the fleet) and how to reach it."""

    name: str
    root: Path
    shared_url: str
    prefix: str = field(default_factory=lambda: f"tc-shd-{secrets.token_hex(4)}")
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> str:
        return str(self.root / "d.sock")

    @property
    def address(self) -> str:
        return "unix:" + self.socket

    @property
    def l3(self) -> Path:
        return self.root / "l3"

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"

    def argv(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "tiercache.daemon", "--socket", self.socket, "--l2-bytes", "4M",
                "--slot-bytes", "64K", "--l3-path", str(self.l3), "--l3-bytes", "16M", "--l1-device", "none",
                "--l2-prefix", self.prefix, "--metrics-port", str(self.metrics_port),
                "--shared-url", self.shared_url, "--shared-timeout-s", "0.5", "--log-level", "DEBUG",
                *extra]  # fmt: skip

    def start(self, *extra: str) -> Host:
        """Start the daemon and wait (bounded) until it serves."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv(*extra), stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                code = self.proc.wait(timeout=0.05)  # doubles as the pause between probes
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                raise AssertionError(
                    f"{self.name} exited with {code}:\n{self.log.read_text(errors='replace')}"
                )
            if not os.path.exists(self.socket):
                continue
            with grpc.insecure_channel(self.address) as ch:
                try:
                    reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                except grpc.RpcError:
                    continue
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return self
        raise AssertionError(f"{self.name} did not serve in time:\n{self.log.read_text(errors='replace')}")

    def metrics(self) -> str:
        """The text of ``/metrics``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())

    def stop(self) -> None:
        """SIGTERM (SIGKILL after the timeout), then remove the socket and segments."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for seg in SHM_DIR.glob(f"{self.prefix}.*"):
            seg.unlink(missing_ok=True)
        Path(self.socket).unlink(missing_ok=True)

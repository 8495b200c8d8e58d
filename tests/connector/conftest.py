"""Fixtures of the connector's end-to-end tests: a real ``tiercache.daemon`` process, and engine processes.

Every daemon is stopped (SIGTERM, then SIGKILL if it does not exit) and its shared-memory segments are
unlinked at teardown; engine processes are killed and reaped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tiercache.connector import ClientConfig, TierCacheClient
from tiercache.errors import TierCacheError
from tiercache.shm import SHM_DIR

HERE = Path(__file__).resolve().parent
ENGINE = HERE / "engine_proc.py"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
ENGINE_TIMEOUT_S = 120.0


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}


@dataclass
class Daemon:
    """A daemon process on a unix socket under a temporary directory."""

    root: Path
    extra_args: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"tiercache-ctest-{secrets.token_hex(4)}")
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def socket(self) -> Path:
        """The socket path."""
        return self.root / "d.sock"

    @property
    def address(self) -> str:
        """The client address."""
        return f"unix:{self.socket}"

    @property
    def log(self) -> Path:
        """The daemon's stderr of its latest start."""
        return self.root / f"daemon-{self.starts}.log"

    def args(self) -> list[str]:
        """The command line."""
        return [
            sys.executable, "-m", "tiercache.daemon",
            "--socket", str(self.socket),
            "--l2-bytes", "16M", "--slot-bytes", "64K",
            "--l3-path", str(self.root / "l3"), "--l3-bytes", "64M",
            "--l1-device", "cpu", "--l1-bytes", "1M",
            "--l2-prefix", self.prefix,
            "--lease-ttl-s", "2",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, token: str | None = None) -> None:
        """Start the daemon and wait (bounded) until it answers Stats."""
        assert self.proc is None, "already running"
        self.starts += 1
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, env=_clean_env())
        deadline = time.monotonic() + START_TIMEOUT_S
        client = TierCacheClient.connect(self.address, token=token, config=ClientConfig(timeout_s=2.0))
        try:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"daemon did not serve within {START_TIMEOUT_S}s:\n{self.log.read_text()}"
                    )
                if client.wait_ready(0.5):
                    try:
                        client.stats()
                        return
                    except TierCacheError:
                        time.sleep(0.1)
        finally:
            client.close()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Signal the daemon and reap it (SIGKILL after a bounded wait); returns its exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        return proc.returncode

    def cleanup(self) -> None:
        """Stop the process and unlink any segment it left."""
        self.stop()
        for path in SHM_DIR.glob(f"{self.prefix}.*"):
            path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A running daemon shared by the tests of a module that do not change its state (use distinct prompts)."""
    d = Daemon(tmp_path_factory.mktemp("shared-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Make (unstarted) daemons with extra CLI args; all are stopped and cleaned at teardown."""
    made: list[Daemon] = []

    def make(*extra_args: str, name: str = "d") -> Daemon:
        root = tmp_path / name
        root.mkdir()
        d = Daemon(root, list(extra_args))
        made.append(d)
        return d

    yield make
    for d in made:
        d.cleanup()


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    """A running daemon without authentication."""
    d = daemon_factory()
    d.start()
    return d


@pytest.fixture(scope="session")
def engine_mod() -> ModuleType:
    """``engine_proc.py`` imported by path (for its deterministic prompt and KV generators)."""
    spec = importlib.util.spec_from_file_location("tiercache_test_engine_proc", ENGINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run_engine(**params: Any) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ENGINE), json.dumps(params)],
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        env=_clean_env(),
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def run_engine() -> Callable[..., dict[str, Any]]:
    """Run one engine process (``engine_proc.py`` with keyword params) to completion; returns its JSON line."""
    return _run_engine


@pytest.fixture
def spawn_engine() -> Iterator[Callable[..., tuple[subprocess.Popen[str], dict[str, Any]]]]:
    """Start a long-running engine process and wait (bounded) for its first JSON line; killed at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def spawn(**params: Any) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        proc = subprocess.Popen(
            [sys.executable, str(ENGINE), json.dumps(params)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_env(),
        )
        procs.append(proc)
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(ENGINE_TIMEOUT_S):
                raise AssertionError("engine process printed nothing in time")
        line = proc.stdout.readline()
        if not line:
            proc.wait(STOP_TIMEOUT_S)
            raise AssertionError(f"engine process died: {proc.stderr.read() if proc.stderr else ''}")
        return proc, json.loads(line)

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(STOP_TIMEOUT_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

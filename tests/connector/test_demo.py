"""The model demo (``python -m tiercache.connector.demo``) in a tiny configuration, as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tiercache.connector.local_daemon import answers

pytest.importorskip("transformers")  # the demo runs a Hugging Face model

Daemon = Any  # tests/connector/conftest.py:Daemon

TINY = [
    "--hidden", "64", "--layers", "2", "--chunk-tokens", "16", "--system-tokens", "64", "--requests", "3",
    "--question-tokens", "16", "--turns", "2", "--new-tokens", "4", "--no-progress",
]  # fmt: skip


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    cmd = [sys.executable, "-m", "tiercache.connector.demo", *TINY, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def _rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#  request"))
    body = lines[start + 2 :]
    return [line.split() for line in body[: body.index(next(x for x in body if x.startswith("---")))]]


def _check_table(stdout: str) -> None:
    rows = _rows(stdout)
    assert [" ".join(r[1:-7]) for r in rows] == [
        "shared 1",
        "shared 2",
        "shared 3",
        "chat turn 1",
        "chat turn 2",
    ]
    assert len(rows) == 5
    # columns from the right: ... prompt cached tier ttft-cache ttft-off speedup same
    prompt = [int(r[-7]) for r in rows]
    cached = [int(r[-6]) for r in rows]
    tiers = [r[-5] for r in rows]
    assert prompt[:3] == [64 + 12, 64 + 16, 64 + 20]
    assert cached[0] == 0 and tiers[0] == "-"
    assert cached[1:3] == [64, 64] and tiers[1:3] == ["L2", "L2"]  # the shared system prompt's four chunks
    assert cached[3] == 0  # the chat's first turn: 32 + 16 tokens, never seen
    assert cached[4] == 48 and tiers[4] == "L2"  # turn 2 reuses turn 1's three full chunks
    assert all(float(r[-4]) > 0 and float(r[-3]) > 0 for r in rows)
    assert [r[-1] for r in rows] == ["yes"] * 5
    assert "cached 176 of" in stdout


def test_demo_starts_a_daemon_and_stops_it(tmp_path: Path) -> None:
    sock = tmp_path / "d.sock"
    log = tmp_path / "daemon.log"
    args = ["--socket", str(sock), "--l3-path", str(tmp_path / "l3"), "--l2-bytes", "8M", "--l3-bytes", "64M"]
    out = _demo(*args, "--daemon-log", str(log))
    assert out.returncode == 0, out.stderr
    assert f"started a daemon on {sock}" in out.stdout
    _check_table(out.stdout)
    assert "tiercache-daemon stopped" in log.read_text()
    assert not answers(f"unix:{sock}")


def test_demo_uses_a_running_daemon_and_leaves_it_running(shared_daemon: Daemon) -> None:
    out = _demo("--socket", str(shared_daemon.socket), "--force-remote")
    assert out.returncode == 0, out.stderr
    assert f"daemon on {shared_daemon.socket};" in out.stdout and "byte stream" in out.stdout
    _check_table(out.stdout)
    assert answers(shared_daemon.address)

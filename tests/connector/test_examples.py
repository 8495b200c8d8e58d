"""The runnable examples in ``connector/examples`` against a real daemon process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "connector" / "examples"
RUN_TIMEOUT_S = 300

Daemon = Any  # tests/connector/conftest.py:Daemon


@pytest.mark.slow
def test_hf_generate_hits_the_cache_on_its_second_run(daemon: Daemon) -> None:
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERCACHE_")}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "hf_generate.py"), daemon.address],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        cwd=EXAMPLES,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    first, second = summary["runs"]
    assert first["reused"] == 0 and first["stored"] > 0  # a fresh daemon: computed, then stored
    assert second["reused"] > 0  # the second run loads the prefix
    assert summary["same_tokens"] and first["tokens"] == second["tokens"]
    assert "second run hit the cache: True" in out.stdout

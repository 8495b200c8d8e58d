"""A real vLLM engine (CPU, tiny random-weight Llama) over the daemon's byte stream (``data_plane``).

The daemon's shared-memory segment is unlinked from this host's ``/dev/shm`` once the first engine has saved
through it: from then on no engine can map it (as for a daemon on another host), so every byte the second
engine loads came over the stream. Outputs are greedy over float32, so "identical" means token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.connector.vllm.conftest import CHUNK, RunVllm, extra, prompt
from tiercache.connector import TierCacheClient
from tiercache.shm import SHM_DIR
from tiercache.testing.daemon import DaemonProcess as Daemon

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

SHARED_A = prompt(31, 5 * CHUNK)  # 5 full chunks shared by the first and second engines' first prompts
SHARED_B = prompt(32, 3 * CHUNK)
FIRST = [SHARED_A + prompt(33, 20), SHARED_B + prompt(34, 40)]
SECOND = [SHARED_A + prompt(35, 10), SHARED_B + prompt(36, 7)]


def _batch(prompts: list[list[int]]) -> list[dict[str, Any]]:
    return [{"tokens": p} for p in prompts]


def _field(result: dict[str, Any], name: str) -> list[Any]:
    return [r[name] for r in result["batches"][0]]


def test_stream_engine_loads_another_engines_prefix_bit_exact(
    run_vllm: RunVllm, daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    daemon.start()
    a = run_vllm(record_dir=tmp_path / "a", extra=extra(daemon.address), batches=[_batch(FIRST)])
    assert _field(a, "cached") == [0, 0]
    gone = list(SHM_DIR.glob(f"{daemon.prefix}.*"))
    assert gone, "the daemon's segment was not found to unlink"
    for path in gone:
        path.unlink()  # the daemon keeps its mapping; no engine can map the segment any more

    b = run_vllm(
        record_dir=tmp_path / "b",
        extra=extra(daemon.address, data_plane="stream"),
        batches=[_batch(SECOND)],
    )
    plain = run_vllm(extra=None, batches=[_batch(SECOND)])

    assert _field(b, "cached") == [5 * CHUNK, 3 * CHUNK]  # every shared full chunk, over the stream
    assert _field(b, "tokens") == _field(plain, "tokens")
    loads = sorted((tmp_path / "b").glob("load-*.bin"))
    assert len(loads) == 5 + 3
    for load in loads:
        saved = tmp_path / "a" / load.name.replace("load-", "save-")
        assert saved.exists(), f"the stream engine loaded {load.name}, which the first engine never saved"
        assert load.read_bytes() == saved.read_bytes()
    with TierCacheClient.connect(daemon.address) as client:
        assert client.stats().active_leases == 0

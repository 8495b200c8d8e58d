"""Tests of ``tiercache-bench compare``: a tiny real run, a missing redis-server, and corruption."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import tiercache.bench.peers as peers
import tiercache.bench.redis_server as redis_server
from tiercache.bench.cli import main
from tiercache.bench.compare import CompareConfig, _measure, _prompts
from tiercache.bench.peers import FileStore
from tiercache.bench.progress import ProgressBar
from tiercache.bench.refmodel import ModelSpec
from tiercache.bench.tiers import RoundTripError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--prompts", "2",
        "--prompt-tokens", "96", "--chunk-tokens", "32", "--daemon-l2-bytes", "1M", "-q"]  # fmt: skip
PEERS = {
    "recompute (prefill)",
    "tiercache (shared memory)",
    "tiercache (byte stream)",
    "redis",
    "files (fsync=on)",
}


def _redis_installed() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return redis_server.shutil.which("redis-server") is not None


@pytest.mark.skipif(
    not _redis_installed(), reason="needs redis-server and the redis client (CI installs them)"
)
def test_tiny_run_json_is_complete_and_consistent(work: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    argv = ["compare", *TINY, "--fsync", "--dir", str(work), "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/compare/1" and png.stat().st_size > 0
    assert doc["machine"]["cpu_count"] > 0 and doc["config"]["model"]["layers"] == 2
    assert doc["redis"].startswith("redis-server")
    by_name = {p["name"]: p for p in doc["peers"]}
    assert set(by_name) == PEERS
    ref = by_name["tiercache (shared memory)"]
    kv_bytes = (2 * 96) * 2 * 2 * 2 * 16 * 4  # tokens x layers x (K, V) x kv heads x head dim x fp32
    for p in by_name.values():
        assert p["status"] == "ok" and p["tokens"] == 2 * 96
        assert p["nbytes"] == kv_bytes and p["load_s"] > 0
        assert math.isclose(p["load_gbps"], p["nbytes"] / p["load_s"] / 1e9)
        if p["name"] != "recompute (prefill)":
            assert p["verified_bytes"] == p["nbytes"] and p["store_s"] > 0
        if p is not ref:
            assert math.isclose(p["load_ratio"], p["load_s"] / ref["load_s"])


def test_missing_redis_server_is_a_skipped_row(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    out = tmp_path / "c.json"
    assert main(["compare", *TINY, "--no-stream", "--dir", str(work), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    redis = next(p for p in doc["peers"] if p["name"] == "redis")
    assert redis["status"] == "skipped" and "redis-server is not installed" in redis["reason"]
    assert redis["load_s"] is None and doc["redis"].startswith("skipped")
    assert all(p["status"] == "ok" for p in doc["peers"] if p["name"] != "redis")


def test_a_flipped_byte_read_from_a_chunk_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = CompareConfig(
        model=ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128),
        chunk_tokens=32,
        prompts=1,
        prompt_tokens=64,
    )
    prompts, layout = _prompts(config, ProgressBar(1, "test", enabled=False))
    real = peers.chunk_to_kv

    def corrupting(lay: KVLayout, buf: torch.Tensor, kv: Any, chunk: int, *rest: Any) -> None:
        buf = buf.clone()
        buf[11] ^= 0x04
        real(lay, buf, kv, chunk, *rest)

    monkeypatch.setattr(peers, "chunk_to_kv", corrupting)
    store = FileStore(Namespace("m", "r", layout), tmp_path / "files", fsync=False)
    with pytest.raises(RoundTripError, match="layer 0: loaded KV differs"):
        _measure(store, prompts, layout, ProgressBar(1, "test", enabled=False))

"""Tests of ``tiercache-bench compare``: tiny real runs in rounds (medians, spreads, rotation, a given Redis
left empty), one round, a missing redis-server, bad ``--rounds``, and corruption."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

import tiercache.bench.compare.peers as peers
import tiercache.testing.redis as redis_server
from tiercache.bench.cli import main
from tiercache.bench.common.progress import ProgressBar
from tiercache.bench.common.tier_ops import RoundTripError
from tiercache.bench.compare.peers import FileStore
from tiercache.bench.compare.refmodel import ModelSpec
from tiercache.bench.compare.run import CompareConfig, _measure, _workload
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

pytest.importorskip("transformers")  # the reference model

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


needs_redis = pytest.mark.skipif(
    not _redis_installed(), reason="needs redis-server and the redis client (CI installs them)"
)


def _check_spread(spread: dict[str, Any], rounds_s: list[float], rounds: int) -> None:
    """A spread is the median, lowest and highest of the rounds it was taken over."""
    assert len(rounds_s) == spread["rounds"] == rounds
    assert math.isclose(spread["median"], statistics.median(rounds_s))
    assert spread["low"] == min(rounds_s) and spread["high"] == max(rounds_s)


@needs_redis
def test_tiny_run_in_rounds_keeps_medians_spreads_and_rotates_the_order(work: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # --plot
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    argv = ["compare", *TINY, "--rounds", "3", "--fsync", "--dir", str(work), "--json", str(out),
            "--plot", str(png)]  # fmt: skip
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/compare/2" and png.stat().st_size > 0
    assert doc["machine"]["cpu_count"] > 0 and doc["config"]["model"]["layers"] == 2
    assert doc["redis"].startswith("redis-server")
    assert doc["rounds"] == doc["config"]["rounds"] == 3
    by_name = {p["name"]: p for p in doc["peers"]}
    assert set(by_name) == PEERS
    first = doc["orders"][0]
    assert sorted(first) == sorted(PEERS) and first[0] == "recompute (prefill)"
    assert doc["orders"] == [first, first[1:] + first[:1], first[2:] + first[:2]]
    ref = by_name["tiercache (shared memory)"]
    kv_bytes = (2 * 96) * 2 * 2 * 2 * 16 * 4  # tokens x layers x (K, V) x kv heads x head dim x fp32
    for p in by_name.values():
        assert p["status"] == "ok" and p["tokens"] == 2 * 96 and p["rounds"] == 3
        assert p["nbytes"] == kv_bytes and p["load_s"] > 0
        _check_spread(p["load_spread"], p["load_rounds_s"], 3)
        assert p["load_s"] == p["load_spread"]["median"]
        assert math.isclose(p["load_gbps"], p["nbytes"] / p["load_s"] / 1e9)
        low, high = p["load_gbps_range"]
        assert math.isclose(low, kv_bytes / max(p["load_rounds_s"]) / 1e9) and low <= p["load_gbps"] <= high
        if p["name"] != "recompute (prefill)":
            assert p["verified_bytes"] == 3 * p["nbytes"] and p["store_s"] > 0
            _check_spread(p["store_spread"], p["store_rounds_s"], 3)
        if p is ref:
            assert p["load_ratio"] is None and p["load_ratio_spread"] is None
            continue
        assert math.isclose(p["load_ratio"], p["load_s"] / ref["load_s"])  # the ratio of the medians
        per_round = [a / b for a, b in zip(p["load_rounds_s"], ref["load_rounds_s"], strict=True)]
        _check_spread(p["load_ratio_spread"], per_round, 3)
        if p["name"] != "recompute (prefill)":
            assert math.isclose(p["store_ratio"], p["store_s"] / ref["store_s"])
            per_round = [a / b for a, b in zip(p["store_rounds_s"], ref["store_rounds_s"], strict=True)]
            _check_spread(p["store_ratio_spread"], per_round, 3)


@needs_redis
def test_a_given_redis_is_left_empty_after_every_round(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with redis_server.use_redis(None, tmp_path) as (client, _desc):
        url = f"unix://{client.connection_pool.connection_kwargs['path']}"
        client.set(b"not-the-bench", b"kept")
        out = tmp_path / "c.json"
        argv = ["compare", *TINY, "--rounds", "2", "--no-stream", "--redis-url", url, "--dir", str(work),
                "--json", str(out)]  # fmt: skip
        assert main(argv) == 0
        assert client.keys() == [b"not-the-bench"]
    doc = json.loads(out.read_text())
    redis = next(p for p in doc["peers"] if p["name"] == "redis")
    assert doc["redis"] == url and redis["status"] == "ok" and redis["verified_bytes"] == 2 * redis["nbytes"]
    table = capsys.readouterr().out
    assert "load x/round" in table and "2 interleaved rounds" in table
    assert re.search(r"\d \(\d\.\d+-\d\.\d+\)", table)  # a median round with its lowest-highest


def test_one_round_with_redis_missing_is_one_pass_each_and_a_skipped_row(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    out = tmp_path / "c.json"
    argv = ["compare", *TINY, "--rounds", "1", "--no-stream", "--dir", str(work), "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert [p["name"] for p in doc["peers"]] == [
        "recompute (prefill)", "tiercache (shared memory)", "redis", "files (fsync=off)"
    ]  # fmt: skip
    redis = doc["peers"][2]
    assert redis["status"] == "skipped" and "redis-server is not installed" in redis["reason"]
    assert redis["load_s"] is None and redis["rounds"] == 0 and doc["redis"].startswith("skipped")
    assert doc["orders"] == [["recompute (prefill)", "tiercache (shared memory)", "files (fsync=off)"]]
    for p in doc["peers"]:
        if p["name"] != "redis":  # one round: one pass each, its figure is the pass
            assert p["status"] == "ok" and p["rounds"] == 1 and p["load_rounds_s"] == [p["load_s"]]
    table = capsys.readouterr().out
    assert "x/round" not in table and not re.search(r"\d \(\d", table)  # no "0.006 (0.005-0.007)"


@pytest.mark.parametrize("value", ["0", "-2", "three", "1.5"])
def test_bad_rounds_are_refused_naming_the_flag(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--rounds", value])
    assert exc.value.code == 2
    assert "--rounds" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0, -1, True])
def test_a_config_with_bad_rounds_names_the_field(value: int) -> None:
    with pytest.raises(ValueError, match=r"^rounds: must be a positive integer"):
        CompareConfig(rounds=value)


def test_a_flipped_byte_read_from_a_chunk_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = CompareConfig(
        model=ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128),
        chunk_tokens=32,
        prompts=1,
        prompt_tokens=64,
    )
    load = _workload(config, ProgressBar(1, "test", enabled=False))
    prompts, layout = load.prompts, load.layout
    real = peers.chunk_to_kv

    def corrupting(lay: KVLayout, buf: torch.Tensor, kv: Any, chunk: int, *rest: Any) -> None:
        buf = buf.clone()
        buf[11] ^= 0x04
        real(lay, buf, kv, chunk, *rest)

    monkeypatch.setattr(peers, "chunk_to_kv", corrupting)
    store = FileStore(Namespace("m", "r", layout), tmp_path / "files", fsync=False)
    with pytest.raises(RoundTripError, match="layer 0: loaded KV differs"):
        _measure(store, prompts, layout, ProgressBar(1, "test", enabled=False))

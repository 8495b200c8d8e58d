"""The shared tier in the benches: ``tiers`` measures it against raw redis-py SET/GET on the same cluster in
the same run, and ``fleet`` shows what it is worth for a trace spread over two hosts (tiny real runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tiercache.bench.cli import main

needs_redis = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="needs redis-server and redis-cli",
)


@needs_redis
def test_tiers_measures_the_shared_tier_against_raw_set_get(tmp_path: Path) -> None:
    out = tmp_path / "tiers.json"
    argv = ["tiers", "--tiers", "L2,SHARED", "--chunk-sizes", "256K", "--bytes-per-size", "2M",
            "--warmup", "1", "--dir", str(tmp_path / "work"), "--json", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0  # a missed target is a figure in the table, not a failure
    doc: dict[str, Any] = json.loads(out.read_text())
    shared = [r for r in doc["results"] if r["tier"] == "SHARED"]
    assert {r["op"] for r in shared} == {"put", "get"}
    for r in shared:
        assert r["verified_bytes"] == 2 << 20  # every byte read back was compared
        (comparison,) = r["comparisons"]
        assert comparison["ceiling"] == {"put": "redis_set(redis)", "get": "redis_get(redis)"}[r["op"]]
        assert comparison["target"] == 0.8 and comparison["ratio"] > 0
    assert {c["label"] for c in doc["ceilings"]} >= {"redis_set(redis)", "redis_get(redis)"}
    assert list((tmp_path / "work").iterdir()) == []  # the cluster's nodes and files are gone


@needs_redis
def test_fleet_saves_more_prefill_with_the_shared_tier(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    argv = ["fleet", "--requests", "12", "--documents", "4", "--chunk-tokens", "256", "--l2-bytes", "64M",
            "--dir", str(tmp_path / "work"), "--json", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    off, on = doc["modes"]
    assert not off["shared"] and on["shared"]
    assert off["prompt_tokens"] == on["prompt_tokens"] > 0
    assert "SHARED" not in off["saved_tokens_by_tier"] and on["saved_tokens_by_tier"]["SHARED"] > 0
    assert on["saved_tokens"] > off["saved_tokens"]
    assert on["verified_bytes"] > 0 and on["shared_errors"] == 0

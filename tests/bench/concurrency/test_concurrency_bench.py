"""Tests of ``tiercache-bench concurrency``: a tiny real run, its JSON shape, and that verification runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tiercache.bench.cli import main
from tiercache.bench.common.tier_ops import RoundTripError
from tiercache.bench.concurrency import run as concurrency
from tiercache.bench.concurrency.run import ConcurrencyConfig, run_concurrency
from tiercache.tiers.base import TierLevel

SIZES = (64 << 10, 256 << 10)


def test_json_has_every_thread_count_and_size_and_verifies_every_byte(tmp_path: Path) -> None:
    out = tmp_path / "cc.json"
    argv = ["concurrency", "--threads", "1,2", "--chunk-sizes", "64K,256K", "--bytes-per-thread", "1M"]
    assert main([*argv, "--tiers", "L1,L2,L3", "--dir", str(tmp_path), "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert doc["command"] == "concurrency" and doc["manager"].startswith("tiercache.")
    assert doc["config"]["tiers"] == ["L1", "L2", "L3"] and doc["machine"]["cpu_count"] > 0
    assert {(r["threads"], r["chunk_bytes"]) for r in doc["results"]} == {
        (t, s) for t in (1, 2) for s in SIZES
    }
    for r in doc["results"]:
        rounds = (1 << 20) // r["chunk_bytes"]
        assert r["round_trips"] == rounds * r["threads"]
        assert r["verified_bytes"] == r["round_trips"] * r["chunk_bytes"]  # every round trip was compared
        assert r["gbps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
    assert [c["chunk_bytes"] for c in doc["ceilings"]] == list(SIZES)
    assert all(c["kind"] == "memcpy" and c["gbps"] > 0 for c in doc["ceilings"])
    assert [p.name for p in tmp_path.iterdir()] == ["cc.json"]  # the L3 work directory is removed


def test_a_changed_byte_fails_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The verification compares real bytes: a manager that serves one flipped byte fails the run."""
    real_get = concurrency.CacheManager.get

    def corrupt_get(
        self: concurrency.CacheManager, ns: bytes, keys: list[bytes]
    ) -> list[torch.Tensor | None]:
        out = real_get(self, ns, keys)
        first = out[0]
        assert first is not None
        first[7] ^= 1
        return out

    monkeypatch.setattr(concurrency.CacheManager, "get", corrupt_get)
    config = ConcurrencyConfig((1,), (64 << 10,), 128 << 10, (TierLevel.L2,), "cpu", tmp_path)
    with pytest.raises(RoundTripError, match="other bytes"):
        run_concurrency(config)
    assert (
        main(["concurrency", "--threads", "1", "--chunk-sizes", "64K", "--bytes-per-thread", "128K", "-q"])
        == 1
    )

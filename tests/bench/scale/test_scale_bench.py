"""Tests of ``tiercache-bench scale``: a tiny sweep, its JSON, and the warm restart finding every chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiercache.bench.cli import main
from tiercache.bench.scale.run import ScaleConfig


def test_tiny_sweep_json_is_complete(work: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # --plot
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    argv = ["scale", "--counts", "256,1024", "--prompt-chunks", "32", "--lookups", "20", "--evictions", "4",
            "--dir", str(work), "--json", str(out), "--plot", str(png), "-q"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/scale/1" and png.stat().st_size > 0
    points = doc["points"]
    assert [p["chunks"] for p in points] == [256, 1024]
    for p in points:
        assert p["lookup"]["calls"] == 20 and 0 < p["lookup"]["p50_s"] <= p["lookup"]["p99_s"]
        assert p["evict_store"]["calls"] == 4 and p["evict_s_per_chunk"] > 0
        # every chunk was written through to L3 and is found again after the rebuild: the filled ones
        # plus the evicting stores' (which also went through to L3)
        assert p["restart_chunks"] == p["chunks"] + (4 + 2) * 32
        assert p["restart_s"] > 0 and p["anon_bytes_per_chunk"] >= 0
    t = doc["targets"]
    assert t["largest_chunks"] == 1024 and t["lookup_p50_ratio"] > 0
    assert set(t) >= {"lookup_met", "memory_met", "restart_met"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"counts": (100, 10)}, "ascending"), ({"counts": (8,)}, "one prompt"), ({"lookups": 0}, "positive")],
)
def test_bad_config_is_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ScaleConfig(**kwargs)  # type: ignore[arg-type]


def test_bad_counts_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["scale", "--counts", "a,b"])
    assert exc.value.code == 2 and "--counts" in capsys.readouterr().err


def test_bulk_sweep_warm_starts_on_every_chunk(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    argv = ["scale", "--fill", "bulk", "--counts", "256,1024", "--prompt-chunks", "32", "--lookups", "20",
            "--evictions", "4", "--dir", str(work), "--json", str(out), "-q"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["fill"] == "bulk"
    for p in doc["points"]:
        # the warm start found every chunk written in bulk
        assert p["restart_chunks"] == p["chunks"] and p["restart_s"] > 0 and p["restart_cpu_s"] > 0
        assert p["lookup"]["calls"] == 20 and p["evict_store"]["calls"] == 4 and p["evict_s_per_chunk"] > 0


def test_unknown_fill_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["scale", "--fill", "sideways"])
    assert exc.value.code == 2 and "--fill" in capsys.readouterr().err

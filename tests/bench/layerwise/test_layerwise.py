"""``tiercache-bench layerwise`` run tiny against a daemon it starts: the table and the JSON are complete and
consistent (no timing is asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tiercache.bench.layerwise import command as layerwise


def test_a_tiny_run_reports_totals_and_a_full_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    layerwise.configure_parser(parser)
    out = tmp_path / "layerwise.json"
    args = parser.parse_args(
        [
            *[
                "--layers",
                "3",
                "--chunks",
                "2",
                "--chunk-tokens",
                "16",
                "--kv-heads",
                "2",
                "--head-dim",
                "16",
                "--repeats",
                "2",
            ],
            "--json",
            str(out),
        ]
    )
    assert layerwise.run(args) == 0
    table = capsys.readouterr().out
    for text in ("compute only", "then compute", "layerwise", "copy start", "compute end"):
        assert text in table
    report = json.loads(out.read_text())
    assert report["tokens"] == 2 * 16
    assert report["chunk_bytes"] == 3 * 2 * 16 * 2 * 16 * 2
    assert [t["layer"] for t in report["timeline"]] == [0, 1, 2]
    for t in report["timeline"]:
        assert 0 <= t["copy_start_ms"] <= t["copy_end_ms"] <= t["wait_end_ms"] + 1e-3
        assert t["wait_end_ms"] <= t["compute_start_ms"] <= t["compute_end_ms"]
    starts = [t["copy_start_ms"] for t in report["timeline"]]
    assert starts == sorted(starts)  # layer by layer
    assert report["overlap_saved_ms"] == pytest.approx(
        report["load_then_compute_ms"] - report["layerwise_ms"], abs=0.01
    )
    assert report["config"]["repeats"] == 2


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    layerwise.configure_parser(parser)
    assert layerwise.run(parser.parse_args(["--layers", "0"])) == 2
    assert "layers" in capsys.readouterr().out

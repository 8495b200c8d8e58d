"""Tests of ``tiercache-bench connector``: a tiny real run against a daemon it starts, and corruption."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import tiercache.connector.shm_plane as engine
from tiercache.bench.cli import main
from tiercache.bench.connector.h2d import H2D_TARGET
from tiercache.bench.connector.run import LOOKUP_TARGET, STORE_LOAD_TARGET, STREAM_TARGET
from tiercache.layout import KVLayout

TINY = ["--layouts", "tiny,2x4x64", "--chunk-tokens", "64", "--bytes-per-case", "512K", "--rounds", "1",
        "--lookup-calls", "10", "--daemon-l2-bytes", "4M", "-q"]  # fmt: skip


def test_tiny_run_json_is_complete_and_consistent(work: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # --plot
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    assert main(["connector", *TINY, "--dir", str(work), "--json", str(out), "--plot", str(png)]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/connector/1" and doc["daemon"]["embedded"]
    assert len(doc["daemon"]["argv"]) == 1, "one daemon per chunk size"
    assert doc["machine"]["cpu_count"] > 0 and doc["config"]["rounds"] == 1
    assert png.stat().st_size > 0
    figures = doc["figures"]
    got = {(f["case"], f["path"], f["op"]) for f in figures}
    paths = [("shm", "store"), ("shm", "load"), ("rpc", "lookup"), ("stream", "store"), ("stream", "load")]
    if torch.cuda.is_available():
        paths.append(("h2d", "load"))  # the GPU line: loads into device tensors vs the pinned-copy peak
    want = {(c, p, o) for c in ("tiny/64t", "2x4x64/64t") for p, o in paths}
    assert got == want
    ceilings = {(c["case"], c["label"]): c for c in doc["ceilings"]}
    for f in figures:
        assert f["value"] > 0 and f["baseline_value"] > 0
        assert math.isclose(f["ratio"], f["value"] / f["baseline_value"], rel_tol=1e-9)
        judged = f["spread"]["median"] if f["spread"] is not None else f["ratio"]  # the median round's
        assert f["met"] == (judged <= f["target"] if f["at_most"] else judged >= f["target"])
        if f["op"] == "lookup":
            assert f["target"] == LOOKUP_TARGET and f["at_most"] and f["p99_ms"] >= f["p50_ms"]
            continue
        assert f["total_bytes"] == f["chunks"] * f["chunk_bytes"] > 0
        assert math.isclose(f["value"], f["total_bytes"] / f["seconds"] / 1e9, rel_tol=1e-9)
        baseline = ceilings[(f["case"], f["baseline"])]
        assert baseline["chunk_bytes"] == f["chunk_bytes"]
        assert math.isclose(f["baseline_value"], baseline["gbps"], rel_tol=1e-12)
        targets = {"shm": STORE_LOAD_TARGET, "stream": STREAM_TARGET, "h2d": H2D_TARGET}
        assert f["target"] == targets[f["path"]]
        if f["op"] == "load":
            assert f["verified_bytes"] == f["total_bytes"]
        # each round against a ceiling pass taken right before it: memcpy, the bare stream, the pinned copy
        spread = f["spread"]
        assert spread["rounds"] == doc["config"]["rounds"]
        assert spread["low"] <= spread["median"] <= spread["high"]
        if f["path"] in ("shm", "stream"):
            assert baseline["note"].startswith(f"{doc['config']['rounds']} passes, one right before each")
            assert baseline["total_bytes"] == f["total_bytes"]  # the same bytes, pass for round


def test_a_flipped_byte_in_a_load_fails_the_run(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = engine.run_to_kv

    def corrupting(
        layout: KVLayout, run: torch.Tensor, kv: Any, first: int, *rest: Any, **named: Any
    ) -> None:
        real(layout, run, kv, first, *rest, **named)
        if first == 0:  # once per load: one flipped byte in what arrived in the engine's tensors
            kv.layers[-1].view(torch.uint8).view(-1)[5] ^= 0x10

    monkeypatch.setattr(engine, "run_to_kv", corrupting)
    out = tmp_path / "c.json"
    argv = ["connector", *TINY, "--layouts", "tiny", "--no-stream", "--dir", str(work), "--json", str(out)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "round trip FAILED" in captured.err and "layer 3" in captured.err
    assert captured.out == "" and not out.exists()


def test_bad_layout_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["connector", "--layouts", "13b"])
    assert exc.value.code == 2

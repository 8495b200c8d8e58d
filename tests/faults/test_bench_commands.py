"""``tiercache-bench faults`` and ``tiercache-bench soak`` run end to end: a table, a JSON document, and an
exit status that says whether every figure is what it must be (small runs: the parts are tested in full
by the other tests of this folder)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tiercache.bench.cli import main
from tiercache.bench.faults.command import FAULTS_SCHEMA
from tiercache.bench.soak.command import SOAK_SCHEMA


def test_faults_garbage_part_prints_and_writes_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the part makes its short socket dir
    out = tmp_path / "faults.json"
    assert main(["faults", "--parts", "garbage", "--json", str(out), "-q", "--dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == FAULTS_SCHEMA and doc["ok"] is True
    assert doc["kill"] is None and doc["garbage"]["sent"] == doc["garbage"]["invalid_argument"] > 0
    assert "malformed RPCs / INVALID_ARGUMENT" in capsys.readouterr().out
    assert not list(tmp_path.glob("tcgarb-*"))  # the socket's directory went with the daemon


def test_faults_refuses_an_unknown_part(tmp_path: Path) -> None:
    assert main(["faults", "--parts", "garbage,nope", "-q", "--dir", str(tmp_path)]) == 1


def test_soak_of_two_engines_prints_and_writes_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    argv = ["soak", "--engines", "2", "--duration-s", "2", "--prompts", "16", "--json", str(out), "-q"]
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SOAK_SCHEMA and doc["ok"] is True
    assert doc["soak"]["engines"] == 2 and doc["soak"]["errors"] == 0 and doc["soak"]["requests"] > 0
    assert "daemon open fds" in capsys.readouterr().out

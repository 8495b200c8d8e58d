"""``tiercache-bench sglang`` run tiny against a daemon it starts, on SGLang's real host pools: the table
and the JSON are complete, the loads verified (no timing is asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tiercache.bench.sglang import command as sglang_bench
from tiercache.testing.sglang import MISSING

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason=MISSING)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_tiny_run_reports_both_calls_against_memcpy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str
) -> None:
    parser = argparse.ArgumentParser()
    sglang_bench.configure_parser(parser)
    out = tmp_path / "sglang.json"
    tiny = ["--pages", "3", "--page-tokens", "16", "--layers", "2", "--kv-heads", "2", "--head-dim", "32"]
    args = parser.parse_args([*tiny, "--rounds", "2", "--layout", layout, "--json", str(out)])
    assert sglang_bench.run(args) == 0
    table = capsys.readouterr().out
    for line in ("batch_set_v1", "batch_get_v1", "memcpy", "batch_exists", "complete and bit-exact"):
        assert line in table
    doc = json.loads(out.read_text())
    assert doc["verified"] is True and doc["data_plane"] == "SHARED_MEMORY"
    assert doc["batch_bytes"] == 3 * 2 * 16 * 2 * 2 * 32 * 2
    for figure in ("set_vs_memcpy", "get_vs_memcpy"):
        assert doc[figure]["rounds"] == 2 and doc[figure]["median"] > 0


def test_bad_sizes_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    sglang_bench.configure_parser(parser)
    assert sglang_bench.run(parser.parse_args(["--pages", "0"])) == 2
    assert "pages must be positive" in capsys.readouterr().out

"""``tiercache-bench singleflight`` run tiny against a daemon it starts: both modes are reported, every request's KV
is exact, and coordination computes the prompt once (no timing is asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tiercache.bench.singleflight import command as singleflight


def test_a_tiny_run_reports_both_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    singleflight.configure_parser(parser)
    out = tmp_path / "singleflight.json"
    args = parser.parse_args(
        [
            *[
                "--requests",
                "3",
                "--chunks",
                "3",
                "--chunk-tokens",
                "16",
                "--layers",
                "2",
                "--kv-heads",
                "2",
                "--head-dim",
                "16",
            ],
            *["--prefill-tokens-per-s", "2000", "--json", str(out)],
        ]
    )
    assert singleflight.run(args) == 0
    table = capsys.readouterr().out
    for text in ("uncoordinated", "coordinated", "prefill tokens", "first load", "ready"):
        assert text in table
    report = json.loads(out.read_text())
    n = report["prompt_tokens"]
    assert n == 48
    modes = {m["mode"]: m for m in report["modes"]}
    assert set(modes) == {"uncoordinated", "coordinated"}
    for mode in modes.values():
        assert len(mode["requests"]) == 3
        assert all(r["exact"] for r in mode["requests"])
        assert all(r["loaded_tokens"] + r["computed_tokens"] == n for r in mode["requests"])
        assert mode["prefill_tokens"] == sum(r["computed_tokens"] for r in mode["requests"])
        assert mode["max_ready_s"] == max(r["ready_s"] for r in mode["requests"])
        assert all(0 <= r["first_load_s"] <= r["ready_s"] for r in mode["requests"])
    assert modes["uncoordinated"]["prefill_tokens"] == 3 * n
    assert modes["coordinated"]["prefill_tokens"] == n  # one leader; the followers waited and loaded
    assert sorted(r["role"] for r in modes["coordinated"]["requests"]) == ["follower", "follower", "leader"]

"""``tiercache-bench vllm`` in a tiny configuration: real vLLM engines, a real daemon, the TTFT table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.bench.vllm_engines.command import configure_parser, run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
def test_vllm_bench_prints_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vllm.json"
    args = _args(
        "--lengths", "256", "--fractions", "0,100", "--repeats", "2", "--chunk-tokens", "64",
        "--hidden", "256", "--layers", "2", "--no-peers", "--json", str(out),
        "--throughput-requests", "4", "--system-tokens", "128", "--user-tokens", "8",
    )  # fmt: skip
    assert run(args) == 0
    text = capsys.readouterr().out
    assert "tiercache_l2 ms" in text and "lmcache: skipped (--no-peers)" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/vllm/1"
    rows = {(r["length"], r["fraction"]): r for r in doc["rows"]}
    assert sorted(rows) == [(256, 0), (256, 100)]
    # A fresh engine got the cached prefix from the daemon (L2, and L3 after a restart), whole blocks,
    # never the last token; nothing at 0 %.
    assert rows[(256, 100)]["cached_tokens"]["tiercache_l2"] == 224
    assert rows[(256, 100)]["cached_tokens"]["tiercache_l3"] == 224
    assert rows[(256, 100)]["cached_tokens"]["ideal"] == 224
    assert rows[(256, 0)]["cached_tokens"]["tiercache_l2"] == 0
    for row in rows.values():
        assert all(s is None or s > 0 for s in row["seconds"].values())
    # The throughput line: 4 requests over two engines, with and without tiercache. Without it each engine
    # computes the 128-token system prompt once, then its own prefix cache has it (64 tokens: whole
    # blocks, never the whole prompt); with it the daemon already had the system prompt for both engines.
    lines = {t["name"]: t for t in doc["throughput"]}
    assert sorted(lines) == ["plain", "tiercache"]
    assert all(
        t["requests"] == 4 and t["requests_per_s"] > 0 and t["mean_ttft_s"] > 0 for t in lines.values()
    )
    for t in lines.values():  # two runs of each line (interleaved): the slower one is the median run
        assert len(t["runs_per_s"]) == 2 and t["requests_per_s"] == min(t["runs_per_s"])
    assert "(the median of 2 interleaved runs)" in text
    assert lines["plain"]["cached_tokens"] == 2 * 128
    assert lines["tiercache"]["cached_tokens"] == 4 * 128
    assert "throughput: 4 requests over two engines" in text

"""``tiercache-bench engine`` in a tiny configuration: a real daemon, the reference model, the TTFT table."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

from tiercache.bench.engine.command import configure_parser, run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_engine_bench_prints_the_ttft_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")  # the reference model
    out = tmp_path / "engine.json"
    args = _args(
        "--prompt-lengths", "32,64", "--chunk-tokens", "16", "--hidden", "64", "--layers", "2",
        "--repeats", "2", "--warmup", "0", "--l2-bytes", "4M", "--json", str(out), "-q",
    )  # fmt: skip
    assert run(args) == 0
    text = capsys.readouterr().out
    assert "engine TTFT: llama-ref 2 layers" in text and "median of 2" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/engine/1"
    rows = {(r["prompt_tokens"], r["hit_percent"]): r for r in doc["rows"]}
    assert sorted(rows) == [(n, p) for n in (32, 64) for p in (0, 50, 88, 100)]
    # Whole chunks of 16 tokens; a fully cached prompt still recomputes its last token.
    reused = {k: r["tokens_reused"] for k, r in rows.items()}
    assert reused == {
        (32, 0): 0, (32, 50): 16, (32, 88): 16, (32, 100): 31,
        (64, 0): 0, (64, 50): 32, (64, 88): 48, (64, 100): 63,
    }  # fmt: skip
    for r in rows.values():
        assert all(len(r["samples"][k]) == 2 for k in ("recompute", "ideal", "tiercache", "load"))
        assert r["tiercache_s"] > 0 and r["vs_ideal"] == pytest.approx(r["tiercache_s"] / r["ideal_s"])
        assert r["target"].endswith("recompute" if r["hit_percent"] == 0 else "ideal")
        base = r["samples"]["recompute" if r["hit_percent"] == 0 else "ideal"]
        ratios = sorted(t / b for t, b in zip(r["samples"]["tiercache"], base, strict=True))
        assert r["paired"] == pytest.approx(
            {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1], "rounds": 2}
        )
        assert r["met"] == (r["paired"]["median"] <= (1.05 if r["hit_percent"] == 0 else 1.10))
    assert len([line for line in text.splitlines() if line.lstrip()[:2] in ("32", "64")]) == 8


def test_engine_bench_rejects_bad_flags() -> None:
    for bad in (["--hit-fractions", "120"], ["--prompt-lengths", "a,b"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            _args(*bad)

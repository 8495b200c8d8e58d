"""``tiercache-bench serve --quick`` through a real ``vllm serve``, with the daemon SIGKILLed mid-run.

One run (two servers: plain vLLM, then tiercache) answers every assert, so the test costs two server starts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.bench.serve.command import configure_parser, run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_quick_serve_with_the_daemon_killed_mid_run(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "serve.json"
    workloads = tmp_path / "workloads"
    # write-through: what was stored before the kill is on L3 (the default watermark policy keeps what L2
    # took while under half full there only, until the host has a core to spare: a SIGKILL loses it)
    args = _args("--quick", "--kill-daemon-at", "1", "--json", str(out), "--dir", str(work),
                 "--workloads-dir", str(workloads), "--write-policy", "write_through", "-q")  # fmt: skip
    assert run(args) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tiercache-bench/serve/1" and doc["skipped"] == {}
    assert doc["config"]["write_policy"] == "write_through"
    rows = {(r["fits"], r["column"]): r for r in doc["rows"]}
    assert sorted(rows) == [(False, "plain"), (False, "tiercache_l2")]
    for row in rows.values():
        assert row["failed"] == 0 and row["requests"] > 0 and row["req_per_s"] > 0, row
        assert row["ttft_p50_ms"] > 0 and row["ttft_p99_ms"] >= row["ttft_p50_ms"]
        # vLLM's own timings are read: every request was queued and prefilled (the names are vLLM's)
        assert row["queue_ms_mean"] is not None and row["prefill_ms_mean"] > 0 and row["preemptions"] >= 0, (
            row
        )
    # Greedy decoding gave plain vLLM's tokens. How many of the row's prompt tokens came from tiercache depends
    # on where the kill lands: the daemon is down from 1 s into the column until it has restarted (~5 s
    # later on a loaded host, when the quick column may be over: CI once saw 0); the probe after the restart
    # (below) is what must hit.
    ours = rows[(False, "tiercache_l2")]
    assert ours["greedy_mismatches"] == 0
    assert set(ours["ratios"]) >= {"req_per_s_vs_plain", "ttft_p50_vs_plain"}
    # What the connector's scheduler side did, from vLLM's /metrics: it looked requests up (the engine's own
    # counters: the daemon kill does not reset them) and says how long it waited; plain vLLM has none.
    assert ours["lookups"] > 0 and ours["ask_wait_ms_per_lookup"] is not None
    assert ours["late_answers"] >= 0 and rows[(False, "plain")]["lookups"] == 0
    # Tokens vLLM counted as the connector's and then computed (the loads the kill broke, at least):
    # the connector's own count, so that vLLM's connector count and the daemon's loaded tokens reconcile.
    assert ours["offered_recomputed_tokens"] >= 0 and rows[(False, "plain")]["offered_recomputed_tokens"] == 0
    assert "asking chat outgrows c=4 tiercache_l2: " in text
    assert "engine chat outgrows c=4 plain: requests queued " in text
    # The daemon was SIGKILLed mid-run and restarted on its L3: no request failed, and the connector
    # re-attached: the new daemon process served tokens.
    kill = doc["kill"]
    assert kill["error"] == "" and 0 <= kill["killed_at_s"] < kill["restarted_at_s"], kill
    assert kill["failed_requests"] == 0 and kill["hit_tokens_after"] > 0, kill
    assert kill["probe_requests"] > 0 and kill["probe_failed"] == 0 and kill["probe_connector_tokens"] > 0, (
        kill
    )
    assert "daemon kill (tiercache_l2-small)" in text
    print(text)  # the table, for a run with -s
    assert [p.name for p in workloads.iterdir()] == ["chat-c4.jsonl"]

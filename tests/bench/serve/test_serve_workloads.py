"""The workloads and the config of ``tiercache-bench serve`` (no vLLM needed)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tiercache.bench.serve.client import _prompt, _reusable
from tiercache.bench.serve.columns import ColumnKind, Setup, plans
from tiercache.bench.serve.report import _median
from tiercache.bench.serve.run import (
    Cell,
    ServeBenchConfig,
    cells,
    engine_cache_tokens,
    longest_request,
    workload_of,
)
from tiercache.bench.serve.workloads import WorkloadKind, build, read_jsonl, write_jsonl
from tiercache.policies import WritePolicyKind


@pytest.mark.parametrize("kind", list(WorkloadKind), ids=lambda k: k.value)
def test_a_workload_is_sized_to_its_working_set_and_replays_from_jsonl(
    kind: WorkloadKind, tmp_path: Path
) -> None:
    small, big = build(kind, 4096, 1, 16), build(kind, 6 * 4096, 1, 16)
    for w, target in ((small, 4096), (big, 6 * 4096)):
        assert 0.6 * target <= w.working_set_tokens <= target, (w.working_set_tokens, target)
    assert len(big.sessions) > 4 * len(small.sessions)
    assert build(kind, 4096, 1, 16) == small and build(kind, 4096, 2, 16) != small  # seeded
    write_jsonl(big, tmp_path / "w.jsonl")
    assert read_jsonl(tmp_path / "w.jsonl") == big


def test_a_session_resends_its_history_with_the_outputs_and_whole_turn_reuse_counts_whole_blocks() -> None:
    chat = build(WorkloadKind.CHAT, 2048, 0, 8).sessions[0]
    outputs: list[tuple[int, ...]] = [(1,) * 8, (2,) * 8]
    turn2 = _prompt(chat, 2, outputs)
    assert turn2 == [*chat.turns[0], *outputs[0], *chat.turns[1], *outputs[1], *chat.turns[2]]
    # The previous turn: its prompt and its outputs but the last, in whole 32-token blocks.
    assert _reusable(chat, 2, 100, outputs[1], 32) == 96
    assert _reusable(chat, 0, 100, (), 32) == 0
    doc = build(WorkloadKind.DOCQA, 2048, 0, 8).sessions[0]
    assert _prompt(doc, 3, []) == [*doc.prefix, *doc.turns[3]] and _reusable(doc, 3, 800, (1,) * 8, 32) == 0


def test_cells_have_their_own_tokens() -> None:
    config = ServeBenchConfig(workloads=(WorkloadKind.CHAT,), concurrency=(1, 8))
    assert cells(config) == [Cell(WorkloadKind.CHAT, f, c) for f in (True, False) for c in (1, 8)]
    firsts = {c: workload_of(config, c).sessions[0].turns[0][:32] for c in cells(config)}
    # A workload's fits and outgrows rows send the same tokens (only the engine cache differs); each
    # concurrency its own.
    assert firsts[Cell(WorkloadKind.CHAT, True, 1)] == firsts[Cell(WorkloadKind.CHAT, False, 1)]
    assert len(set(firsts.values())) == 2


def test_a_bad_jsonl_line_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    line = {"kind": "chat", "max_tokens": 8, "prefix": [], "turns": [[1, -2]], "history": True}
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        read_jsonl(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("engine_tokens", 0), ("chunk_tokens", 48), ("concurrency", (0,)), ("outgrow_factor", 0.5), ("sets", ()),
     ("kill_daemon_at_s", -1.0), ("hidden", 200), ("layers", 0)],
)  # fmt: skip
def test_a_bad_config_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ServeBenchConfig(**{field: value})  # type: ignore[arg-type]


def test_the_default_engine_cache_holds_the_requests_in_flight() -> None:
    # An engine cache smaller than the requests in flight caps vLLM's batch, which no cache tier lifts:
    # the default holds 1.5x the largest concurrency's longest requests, in whole blocks, and the
    # workloads outgrow that.
    config = ServeBenchConfig(workloads=(WorkloadKind.CHAT, WorkloadKind.DOCQA), concurrency=(1, 8))
    longest = longest_request(config)
    assert longest == max(
        build(k, 10_000, 1, config.max_tokens).longest_prompt for k in (WorkloadKind.CHAT, WorkloadKind.DOCQA)
    )
    engine = engine_cache_tokens(config)
    assert engine % config.block_size == 0
    assert 1.5 * 8 * longest <= engine < 1.5 * 8 * longest + config.block_size
    chat = workload_of(config, Cell(WorkloadKind.CHAT, False, 8))
    assert chat.working_set_tokens >= 0.9 * config.outgrow_factor * engine
    assert engine_cache_tokens(replace(config, concurrency=(1,))) == 2048  # the floor
    assert engine_cache_tokens(replace(config, engine_tokens=4096)) == 4096  # given: taken as is


def test_fits_rows_come_from_servers_with_the_ideals_cache_and_plain_big_is_the_ideal() -> None:
    every = plans(list(ColumnKind), (True, False))
    assert [(p.name, p.rows) for p in every] == [
        ("plain-small", ((ColumnKind.PLAIN, False),)),
        ("plain-big", ((ColumnKind.PLAIN, True), (ColumnKind.IDEAL, False))),
        ("tiercache_l2-small", ((ColumnKind.TIERCACHE_L2, False),)),
        ("tiercache_l2-big", ((ColumnKind.TIERCACHE_L2, True),)),
        ("tiercache_l3-small", ((ColumnKind.TIERCACHE_L3, False),)),
        ("tiercache_rpc-small", ((ColumnKind.TIERCACHE_RPC, False),)),
        ("lmcache-small", ((ColumnKind.LMCACHE, False),)),
        ("lmcache-big", ((ColumnKind.LMCACHE, True),)),
        ("native-small", ((ColumnKind.NATIVE, False),)),
    ]
    assert [p.name for p in plans([ColumnKind.PLAIN, ColumnKind.TIERCACHE_L2], (False,))] == [
        "plain-small", "tiercache_l2-small"
    ]  # fmt: skip


def test_a_daemon_kill_needs_a_tiercache_column() -> None:
    with pytest.raises(ValueError, match="kill_daemon_at_s"):
        ServeBenchConfig(columns=(ColumnKind.PLAIN, ColumnKind.LMCACHE), kill_daemon_at_s=1.0)


def test_servers_leave_one_core_to_the_daemon_by_default() -> None:
    from tiercache.bench.serve.run import default_threads

    assert [default_threads(n) for n in (None, 1, 2, 16)] == [1, 1, 1, 15]


def test_every_tiercache_server_starts_on_an_empty_l3_with_the_runs_write_policy(tmp_path: Path) -> None:
    # A repeat's daemon once reopened the L3 of the repeat before it, and served its first turns from there.
    setup = Setup(
        tmp_path / "model", tmp_path, 2048, 4096, 8192, 1024, 32, 32, 8192, 1, "", WritePolicyKind.ON_EVICT
    )
    left = tmp_path / "l3-tiercache_l2-big"
    left.mkdir()
    (left / "data.mdb").write_bytes(b"chunks of the repeat before")
    daemon = setup.daemon(ColumnKind.TIERCACHE_L2, "tiercache_l2-big")
    assert not left.exists()
    argv = daemon.argv
    assert argv[argv.index("--write-policy") + 1] == "on_evict"
    shutil.rmtree(daemon.socket.parent, ignore_errors=True)


def test_medians_of_counts_stay_whole() -> None:
    # With 2 repeats the table printed token counts as 74400.0 and turns as 225.0/225.0.
    assert _median([225, 225]) == 225 and isinstance(_median([225, 225]), int)
    assert _median([3, 4]) == 4 and isinstance(_median([3, 4]), int)
    assert _median([1.5, 2.0]) == 1.75

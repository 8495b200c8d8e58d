"""``tiercache-bench vllm``'s configuration of its model and daemon (no vLLM needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tiercache.bench.vllm_engines.columns import VllmBenchConfig, build_model, engine_params, tiercache_daemon
from tiercache.bench.vllm_engines.command import configure_parser
from tiercache.cache.config import CacheConfig
from tiercache.policies.write import WritePolicyKind


def test_the_model_has_positions_for_the_throughput_prompts_longer_than_every_timed_prompt(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    # 512-token prompts, a 1024 + 128-token throughput line: vLLM refuses an engine longer than its model.
    config = VllmBenchConfig(lengths=(512,), hidden=128, layers=1, system_tokens=1024, user_tokens=128)
    model = build_model(tmp_path / "model", config)
    positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert positions >= engine_params(model, config, None, [])["max_model_len"] >= 1024 + 128 + 1


def test_the_daemon_holds_what_the_bench_stores_and_reserves_no_more_disk_than_that() -> None:
    config = VllmBenchConfig(lengths=(256,), fractions=(0, 100), repeats=1, chunk_tokens=64, hidden=256,
                             layers=2, throughput_requests=4, system_tokens=128, user_tokens=8)  # fmt: skip
    daemon = tiercache_daemon(config)
    chunk = 2 * 2 * 2 * 64 * 4 * 64  # layers x K/V x KV heads x head size x float32 x chunk tokens
    stored = 2 * 2 * 256 // 64 + 4 * (128 + 8) // 64  # every timed prompt (L2 and L3 cases), the line's
    assert daemon.slot_bytes == chunk
    assert stored * chunk <= daemon.l2_bytes == daemon.l3_bytes <= 64 << 20
    assert tiercache_daemon(VllmBenchConfig()).l3_bytes <= 4 << 30  # it was 8 GiB: 10 GiB preallocated


def test_the_daemon_runs_the_daemons_own_write_policy_unless_told() -> None:
    # A write-through daemon wrote every stored chunk to LMDB beside the next prompt's prefill: the table
    # measured a setting a user does not run (1K, 100 % cached: 35 ms against 25 ms with the default).
    assert tiercache_daemon(VllmBenchConfig()).write_policy is CacheConfig().write_policy
    told = VllmBenchConfig(write_policy=WritePolicyKind.WRITE_THROUGH)
    assert tiercache_daemon(told).write_policy is WritePolicyKind.WRITE_THROUGH


def test_the_write_policy_flag_is_parsed_and_checked() -> None:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert parser.parse_args([]).write_policy is CacheConfig().write_policy
    assert parser.parse_args(["--write-policy", "on_evict"]).write_policy is WritePolicyKind.ON_EVICT
    with pytest.raises(SystemExit):
        parser.parse_args(["--write-policy", "sometimes"])

"""The ``vllm serve`` launcher's command line and log reading (no server started: the bench test does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.testing.vllm_server import VllmServerConfig, kv_cache_tokens_in


def test_the_kv_cache_size_is_read_back_from_the_log() -> None:
    log = "(EngineCore pid=1) INFO [kv_cache_utils.py:2328] CPU KV cache size: 12,288 tokens, Maximum concurrency"
    assert kv_cache_tokens_in("starting\n" + log) == 12288
    assert kv_cache_tokens_in("starting") is None


def test_every_server_gets_the_same_threads_and_binding_and_its_cache_bound(tmp_path: Path) -> None:
    config = VllmServerConfig(tmp_path, 1 << 20, kv_transfer_config={"kv_connector": "X"}, threads=3)
    argv = config.argv(8000)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(1 << 20)
    assert (
        "--skip-tokenizer-init" in argv
        and argv[argv.index("--kv-transfer-config") + 1] == '{"kv_connector": "X"}'
    )
    env = config.environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "3"
    with pytest.raises(ValueError, match="block_size"):
        VllmServerConfig(tmp_path, 1 << 20, block_size=48)

"""SGLang's real runtime with TierCacheStorage as its HiCache storage (needs a CUDA device and SGLang's GPU
build: skipped elsewhere). A first server computes a prompt and HiCache writes its pages through to the
daemon; after it is shut down, a second server started fresh finds the prompt's pages in the daemon,
prefetches them into its host pool instead of recomputing them, and answers the same greedy tokens."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import torch

from tiercache.connector import TierCacheClient
from tiercache.testing.daemon import DaemonProcess
from tiercache.testing.sglang import BACKEND_CONFIG, MISSING
from tiercache.tiers.base import TierLevel

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason=MISSING)

PAGE = 64
PROMPT_PAGES = 8
STORE_WAIT_S = 60.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A saved tiny Llama (bfloat16 safetensors) with fixed random weights; prompts are token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=4096, max_position_embeddings=4096,
    )  # fmt: skip
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return str(path)


def _engine(model: str, daemon: DaemonProcess) -> Any:
    import sglang

    extra = {**BACKEND_CONFIG, "address": daemon.address}
    return sglang.Engine(
        model_path=model, skip_tokenizer_init=True, dtype="bfloat16", page_size=PAGE,
        mem_fraction_static=0.3, disable_cuda_graph=True, enable_hierarchical_cache=True, hicache_ratio=2.0,
        hicache_write_policy="write_through", hicache_mem_layout="page_first",
        hicache_storage_backend="dynamic", hicache_storage_backend_extra_config=json.dumps(extra),
        hicache_storage_prefetch_policy="wait_complete",
    )  # fmt: skip


def _generate(engine: Any, prompt: list[int]) -> dict[str, Any]:
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 4, "temperature": 0.0})
    assert isinstance(out, dict)
    return out


def _stored_chunks(client: TierCacheClient) -> int:
    return client.stats().tier(TierLevel.L2).chunks


@pytest.mark.gpu
def test_a_fresh_server_loads_the_pages_another_server_stored(tiny_model: str, daemon: DaemonProcess) -> None:
    prompt = torch.randint(10, 4000, (PROMPT_PAGES * PAGE + 5,), generator=torch.Generator().manual_seed(3))
    tokens = prompt.tolist()
    client = TierCacheClient.connect(daemon.address)
    try:
        first = _engine(tiny_model, daemon)
        try:
            cold = _generate(first, tokens)
            # HiCache writes the pages through host memory to the backend on its own threads: wait for them
            # (bounded) before this server goes away.
            deadline = time.monotonic() + STORE_WAIT_S
            tick = threading.Event()
            while _stored_chunks(client) < PROMPT_PAGES and time.monotonic() < deadline:
                tick.wait(0.2)
        finally:
            first.shutdown()
        assert _stored_chunks(client) >= PROMPT_PAGES

        second = _engine(tiny_model, daemon)
        try:
            warm = _generate(second, tokens)
        finally:
            second.shutdown()
        assert warm["output_ids"] == cold["output_ids"]
        assert warm["meta_info"]["cached_tokens"] >= PROMPT_PAGES * PAGE - PAGE
        stats = client.stats()
        assert sum(t.lookup_hit_tokens for t in stats.tiers) >= PROMPT_PAGES * PAGE - PAGE
    finally:
        client.close()

"""Fixtures of the vLLM connector tests: a tiny random-weight Llama and vLLM engine processes.

The model is built with ``transformers`` from a config and a fixed seed (float32, 2 layers, 2 KV heads of
64, vocab 4096: a 32-token chunk is 64 KiB, one slot of the test daemon); nothing is downloaded. Each engine
runs ``engine.py`` in its own process (so two engines never share vLLM's state), spoken to with the
harness's engine line protocol.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiercache.testing.engine import EngineProcess

HERE = Path(__file__).resolve().parent
ENGINE = HERE / "engine.py"
ENGINE_TIMEOUT_S = 600.0
CHUNK = 32
"""Chunk and block size of the tests (tokens)."""


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A saved tiny Llama (safetensors) with fixed random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
        max_position_embeddings=4096,
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.fixture(scope="session")
def tiny_lora(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A rank-8 LoRA adapter (q_proj, v_proj) of :func:`tiny_model` with fixed random weights."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("tiny-lora")
    gen = torch.Generator().manual_seed(1)
    weights = {}
    for layer in range(2):
        for proj, out_features in (("q_proj", 256), ("v_proj", 128)):
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            weights[f"{name}.lora_A.weight"] = torch.randn(8, 256, generator=gen) * 0.05
            weights[f"{name}.lora_B.weight"] = torch.randn(out_features, 8, generator=gen) * 0.05
    save_file(weights, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return str(path)


def prompt(seed: int, n: int) -> list[int]:
    """``n`` deterministic token ids."""
    return [int(t) for t in np.random.default_rng(seed).integers(10, 4000, size=n)]


RunVllm = Callable[..., dict[str, Any]]


def run_engine(model: str, cwd: Path, record_dir: Path | None = None, **params: Any) -> dict[str, Any]:
    """Run one engine process to completion with ``engine.py`` params; returns its result (and its stderr
    as ``stderr``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERCACHE_", "VLLM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    if record_dir is not None:
        record_dir.mkdir(parents=True, exist_ok=True)
        env["TIERCACHE_TEST_RECORD_DIR"] = str(record_dir)
        params["connector"] = "RecordingConnector"
    params.setdefault("model", model)
    engine = EngineProcess([sys.executable, str(ENGINE)], params, env=env, cwd=cwd)
    try:
        result = engine.result(ENGINE_TIMEOUT_S)
        stderr = engine.stderr()
    finally:
        engine.close()
    assert "Traceback" not in stderr, stderr[-5000:]
    result["stderr"] = stderr
    return result


@pytest.fixture
def run_vllm(tiny_model: str, tmp_path: Path) -> RunVllm:
    """:func:`run_engine` on the tiny model, in the test's temporary directory."""

    def run(record_dir: Path | None = None, **params: Any) -> dict[str, Any]:
        return run_engine(tiny_model, tmp_path, record_dir, **params)

    return run


def extra(address: str, **more: Any) -> dict[str, Any]:
    """The connector's extra config for the tests' daemon."""
    return {"address": address, "chunk_tokens": CHUNK, **more}

"""The reference model of the ``compare`` benchmark: a small Llama-style model, seeded, no download.

It comes from :func:`tiercache.connector.hf_model.build_reference_model` when that helper is present,
else from an equivalent config built here. Prefill with it is the "recompute" peer: what an engine does
without a cache. Its KV (the model's real KV) is what the other peers store and load.

Primitives:
    ModelSpec: the model's size and dtype.
    build_model: the seeded model in eval mode (CPU).
    model_layout: the chunk layout of the model's KV.
    prefill_kv: run prefill over a prompt; the per-layer KV as :class:`~tiercache.connector.ContiguousKV`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tiercache.connector import ContiguousKV
from tiercache.layout import KVDtype, KVLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Size of the reference model.

    Attributes:
        layers: decoder layers.
        hidden: hidden size.
        heads: attention heads.
        kv_heads: KV heads (GQA).
        intermediate: MLP size.
        vocab: vocabulary size.
        dtype: ``float32`` or ``bfloat16``.
        seed: weight seed.
    """

    layers: int = 6
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 1024
    vocab: int = 4096
    dtype: str = "float32"
    seed: int = 0

    @property
    def head_dim(self) -> int:
        """``hidden // heads``."""
        return self.hidden // self.heads

    def overrides(self) -> dict[str, Any]:
        """The ``LlamaConfig`` fields of this spec."""
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": 16384,
        }


def build_model(spec: ModelSpec) -> Any:
    """The seeded reference model in eval mode (nothing is downloaded)."""
    dtype = getattr(torch, spec.dtype)
    try:
        from tiercache.connector.hf_model import build_reference_model
    except ImportError:
        pass
    else:
        return build_reference_model(seed=spec.seed, dtype=dtype, **spec.overrides())
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(LlamaConfig(**spec.overrides()))  # type: ignore[no-untyped-call, unused-ignore]  # see hf_model.py
    return model.to(dtype).eval()


def model_layout(spec: ModelSpec, chunk_tokens: int) -> KVLayout:
    """The chunk layout of the model's KV (one page per chunk)."""
    dtype = KVDtype.from_torch(getattr(torch, spec.dtype))
    return KVLayout(spec.layers, spec.kv_heads, spec.head_dim, dtype, chunk_tokens, chunk_tokens)


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


@torch.inference_mode()
def prefill_kv(model: Any, tokens: np.ndarray) -> ContiguousKV:
    """Prefill ``tokens``; per layer ``[2, tokens, kv_heads, head_dim]`` (K then V), contiguous."""
    ids = torch.from_numpy(tokens.astype(np.int64)).unsqueeze(0)
    out = model(input_ids=ids, use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    layers = []
    for i in range(model.config.num_hidden_layers):
        k, v = _layer_kv(cache, i)  # [1, kv_heads, T, D]
        layers.append(torch.stack([k[0].transpose(0, 1), v[0].transpose(0, 1)]).contiguous())
    return ContiguousKV(layers)

"""Facts about a Hugging Face causal LM that decide its KV bytes, and the reference model of tests and demos.

Nothing here downloads weights: the reference model is a Llama-style architecture (GQA, RoPE, RMSNorm,
SwiGLU) built from a config with random weights drawn from a fixed seed. Its KV is the model's real KV.

Primitives:
    reference_config: the reference ``LlamaConfig`` (small enough for a CPU, real enough to matter).
    build_reference_model: that config's model with seeded weights, in eval mode.
    config_digest: a stable hash of a model config (volatile fields dropped, keys sorted).
    model_dtype / kv_layout / model_namespace: the layout and namespace of a model's KV cache.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig, PreTrainedModel

from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout

REFERENCE_CONFIG: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16384,
}
"""The reference architecture: 6 layers, hidden 512, 8 query heads sharing 2 KV heads of 64 dims."""

VOLATILE_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "_commit_hash",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "_attn_implementation_internal",
        "_experts_implementation",
    }
)
"""Config fields that do not change the KV bytes (paths, versions, output switches; dtype is in the layout)."""


def reference_config(**overrides: Any) -> LlamaConfig:
    """The reference ``LlamaConfig`` with ``overrides`` applied (e.g. ``hidden_size=256``)."""
    return LlamaConfig(**{**REFERENCE_CONFIG, **overrides})


def build_reference_model(
    seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any
) -> PreTrainedModel:
    """The reference model with weights drawn from ``seed``, cast to ``dtype``, in eval mode (no download).

    Args:
        seed: seed of the weights (the same seed and overrides give the same weights).
        dtype: parameter (and so KV) dtype, e.g. ``torch.float32`` or ``torch.bfloat16``.
        **overrides: fields of :func:`reference_config` to change.

    Returns:
        A ``LlamaForCausalLM`` on the CPU.
    """
    config = reference_config(**overrides)
    fork = torch.random.fork_rng(devices=[])
    with fork:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call, unused-ignore]  # untyped in transformers<5.20 (vllm extra)
    module: torch.nn.Module = model
    module.to(dtype=dtype)  # in place
    module.eval()
    return model


def config_digest(config: PretrainedConfig) -> str:
    """A stable hex digest of ``config``: every field but :data:`VOLATILE_CONFIG_KEYS`, keys sorted."""
    raw = json.loads(config.to_json_string(use_diff=False))
    stable = {k: v for k, v in raw.items() if k not in VOLATILE_CONFIG_KEYS}
    text = json.dumps(stable, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16, person=b"tc-hfconf").hexdigest()


def model_dtype(model: PreTrainedModel) -> torch.dtype:
    """The dtype of the model's parameters (the dtype of its KV cache)."""
    return next(model.parameters()).dtype


def kv_layout(model: PreTrainedModel, chunk_tokens: int) -> KVLayout:
    """The chunk layout of ``model``'s KV: its layers, KV heads (GQA: not repeated), head dim and dtype.

    Raises:
        InvalidArgumentError: the config lacks the attention fields, or the dtype is not a KV dtype.
    """
    config = model.config.get_text_config(decoder=True)
    try:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    except AttributeError as exc:
        raise InvalidArgumentError("model.config", f"not a decoder with standard attention: {exc}") from None
    return KVLayout(
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=KVDtype.from_torch(model_dtype(model)),
        chunk_tokens=chunk_tokens,
        page_tokens=chunk_tokens,
    )


def model_namespace(
    model: PreTrainedModel,
    chunk_tokens: int,
    revision: str = "",
    cache_salt: str = "",
    model_id: str = "",
) -> Namespace:
    """The namespace of ``model``'s KV: its config digest, dtype and layout, the revision and tenant salt.

    Args:
        model: the model.
        chunk_tokens: tokens per chunk.
        revision: the weights' revision (two checkpoints of one architecture must differ here).
        cache_salt: the tenant's cache salt.
        model_id: a readable name (default: the config's model type; a local path would be volatile).

    Returns:
        ``model_id`` is ``"<name>@<config digest>"``, so that two configs never share a key.
    """
    config = model.config
    name = model_id or str(config.model_type)
    return Namespace(
        model_id=f"{name}@{config_digest(config)}",
        revision=revision,
        layout=kv_layout(model, chunk_tokens),
        cache_salt=cache_salt,
    )

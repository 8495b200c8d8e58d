"""The tiercache namespace of a vLLM engine and of each request: nothing hits across incompatible KV.

From the engine's config: the model and its weight revision, the KV dtype, the attention backend's cache
layout (:class:`~.layout.BackendLayout`), the number of layers, KV heads and head size of this rank, the
block size and chunk size, and the TP/PP rank and world size. Per request: the LoRA adapter's name and the
request's ``cache_salt``. :class:`~tiercache.keys.Namespace` has no field for the backend layout, so it is
folded into the revision (``<revision>+kv:<layout>``): a chunk saved by a CPU engine never loads into a
GPU-layout engine.

Primitives:
    EngineIdentity: the per-engine part (a frozen dataclass); ``namespace(adapter, salt)`` per request.
    engine_identity: read it from a ``VllmConfig``.
    request_factors: the per-request part (LoRA adapter name, cache salt) of a vLLM ``Request``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout

from .layout import BackendLayout


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    """What makes one engine's KV bytes what they are (everything but the per-request factors).

    Attributes:
        model_id: the model (name or path).
        revision: its weight revision ("" for none).
        backend: the attention backend's cache layout.
        layout: layers, KV heads, head size, dtype, chunk and block size of this rank.
        tp_rank, tp_size, pp_rank, pp_size: parallel rank and world sizes.
    """

    model_id: str
    revision: str
    backend: BackendLayout
    layout: KVLayout
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    _cache: dict[tuple[str, str], Namespace] = field(default_factory=dict, compare=False, repr=False)

    def namespace(self, adapter: str = "", cache_salt: str = "") -> Namespace:
        """The namespace of a request with LoRA ``adapter`` ("" for the base model) and ``cache_salt``."""
        key = (adapter, cache_salt)
        ns = self._cache.get(key)
        if ns is None:
            ns = Namespace(
                model_id=self.model_id,
                revision=f"{self.revision}+kv:{self.backend.value}",
                layout=self.layout,
                tp_rank=self.tp_rank,
                tp_size=self.tp_size,
                pp_rank=self.pp_rank,
                pp_size=self.pp_size,
                adapter_id=adapter,
                cache_salt=cache_salt,
            )
            self._cache[key] = ns
        return ns


def _kv_dtype(vllm_config: Any) -> KVDtype:
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype in ("auto", ""):
        dtype = vllm_config.model_config.dtype
        return KVDtype.from_torch(dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype)))
    if cache_dtype in ("fp8", "fp8_e4m3"):
        return KVDtype.FP8_E4M3
    if cache_dtype == "fp8_e5m2":
        return KVDtype.FP8_E5M2
    return KVDtype.from_torch(getattr(torch, cache_dtype))


def engine_identity(
    vllm_config: Any,
    backend: BackendLayout,
    chunk_tokens: int,
    tp_rank: int = 0,
    pp_rank: int = 0,
) -> EngineIdentity:
    """The engine identity of ``vllm_config`` (a ``vllm.config.VllmConfig``) for one rank.

    Raises:
        InvalidArgumentError: the KV dtype is not one tiercache stores, or the chunk size is not a multiple
            of the block size.
    """
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    layout = KVLayout(
        num_layers=int(model.get_num_layers(parallel)),
        num_kv_heads=int(model.get_num_kv_heads(parallel)),
        head_dim=int(model.get_head_size()),
        dtype=_kv_dtype(vllm_config),
        chunk_tokens=chunk_tokens,
        page_tokens=int(vllm_config.cache_config.block_size),
    )
    return EngineIdentity(
        model_id=str(model.model),
        revision=str(model.revision or ""),
        backend=backend,
        layout=layout,
        tp_rank=tp_rank,
        tp_size=int(parallel.tensor_parallel_size),
        pp_rank=pp_rank,
        pp_size=int(parallel.pipeline_parallel_size),
    )


def request_factors(request: Any) -> tuple[str, str]:
    """``(LoRA adapter name, cache salt)`` of a vLLM ``Request`` ("" when absent)."""
    lora = getattr(request, "lora_request", None)
    adapter = str(lora.lora_name) if lora is not None else ""
    salt = getattr(request, "cache_salt", None)
    return adapter, str(salt) if salt else ""

"""SGLang's real HiCache parts on the CPU, for the SGLang backend's tests and its benchmark.

SGLang's runtime needs a GPU, but its host KV pools, its storage config and its storage backend factory run
on the CPU: this module builds them as SGLang's cache controller does, so that tests and the benchmark drive
:class:`~tiercache.connector.sglang.TierCacheStorage` through SGLang's own code. SGLang is imported inside
the functions (the ``sglang`` extra).

Primitives:
    PoolShape: a host pool's geometry (page size, layers, heads, head size; MLA latents).
    host_pool: a real ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` on the CPU.
    storage_config: ``HiCacheStorageConfig`` as the controller builds it for one rank.
    attach: a backend from SGLang's ``StorageBackendFactory`` (``dynamic``), registered as the controller
        registers it.
    page_hashes: SGLang's storage page hashes of a token sequence.
    fill, pages_of: random page contents, and copies of pages, through the pool's own page API.
    BACKEND_CONFIG: the dynamic factory's part of the extra config.
    MISSING: what to say when SGLang is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

MISSING = (
    "SGLang is not installed (pip install -e '.[sglang]', then python tests/sglang_env/fix_torchvision.py: "
    "README, Development)"
)
"""Why SGLang's tests skip, and the benchmark refuses, without the ``sglang`` extra."""

BACKEND_CONFIG: Mapping[str, object] = {
    "backend_name": "tiercache",
    "module_path": "tiercache.connector.sglang",
    "class_name": "TierCacheStorage",
    "interface_v1": 1,
}
"""What SGLang's dynamic factory and cache controller read from the extra config (as the README gives it)."""


@dataclass(frozen=True, slots=True)
class PoolShape:
    """Geometry of a host pool.

    Attributes:
        page: tokens per page.
        layers: attention layers.
        heads: KV heads (MHA).
        head_dim: head size (MHA).
        kv_lora_rank, rope_dim: the latent's parts (MLA: one latent of ``kv_lora_rank + rope_dim``).
        device_tokens: tokens of the device pool the host pool mirrors (the host pool holds twice as many).
        dtype: the KV dtype.
    """

    page: int = 64
    layers: int = 4
    heads: int = 2
    head_dim: int = 64
    kv_lora_rank: int = 64
    rope_dim: int = 32
    device_tokens: int = 1024
    dtype: torch.dtype = torch.bfloat16


def host_pool(layout: str, shape: PoolShape = PoolShape(), mla: bool = False) -> Any:
    """A real SGLang host KV pool on the CPU (``layout``: ``page_first``, ``layer_first``, ...), built from a
    CPU device pool as SGLang's ``build_kv_host_pool`` builds it."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    common = {"device": "cpu", "enable_memory_saver": False, "start_layer": 0, "end_layer": shape.layers}
    if mla:
        dev = MLATokenToKVPool(
            size=shape.device_tokens, page_size=shape.page, dtype=shape.dtype, kv_lora_rank=shape.kv_lora_rank,
            qk_rope_head_dim=shape.rope_dim, layer_num=shape.layers, **common,
        )  # fmt: skip
        return MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, shape.page, layout, pin_memory=False,
            device="cpu", device_capacity_tokens=dev.size, start_layer=0, end_layer=shape.layers,
            target_layer_num=shape.layers,
        )  # fmt: skip
    dev = MHATokenToKVPool(
        size=shape.device_tokens, page_size=shape.page, dtype=shape.dtype, head_num=shape.heads,
        head_dim=shape.head_dim, layer_num=shape.layers, **common,
    )  # fmt: skip
    return MHATokenToKVPoolHost(
        dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, shape.page, layout, pin_memory=False, device="cpu",
        allocator_type="default", pool_label="kv", device_capacity_tokens=dev.size, start_layer=0,
        end_layer=shape.layers, draft_buffer_infos=(), write_back_staging=dev.hicache_write_back_staging,
    )  # fmt: skip


def storage_config(
    extra: Mapping[str, object],
    layout: str,
    model: str = "test/tiny-model",
    mla: bool = False,
    tp_rank: int = 0,
    tp_size: int = 1,
) -> Any:
    """SGLang's ``HiCacheStorageConfig`` for one rank as its cache controller builds it, with the extra config
    ``BACKEND_CONFIG`` + ``extra`` parsed from JSON (as ``--hicache-storage-backend-extra-config`` is)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=layout == "page_first",
        model_name=model, tp_lcm_size=None, should_split_heads=False, dp_rank=0,
        extra_config=json.loads(json.dumps({**BACKEND_CONFIG, **extra})), dcp_size=1, dcp_rank=0,
        logical_page_size=None,
    )  # fmt: skip


def attach(pool: Any, config: Any) -> Any:
    """A backend from SGLang's own ``StorageBackendFactory`` (``dynamic``), registered as SGLang's cache
    controller registers it (anchor pool, then the pool group's KV entry, then the end of registration)."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    backend.register_mem_host_pool_v2(pool, PoolName.KV)
    backend.on_host_pools_registered()
    return backend


def page_hashes(tokens: list[int], page: int) -> list[str]:
    """SGLang's storage page hashes of ``tokens`` (one per full page)."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    hashes = get_storage_hash_str(tokens, None, page_size=page)
    assert isinstance(hashes, list)
    return [str(h) for h in hashes]


def fill(pool: Any, indices: torch.Tensor, seed: int) -> None:
    """Random values in the pages that start at ``indices[::page]``, written through the pool's page API."""
    gen = torch.Generator().manual_seed(seed)
    for start in indices[:: pool.page_size].tolist():
        page = pool.get_data_page(start, flat=True)
        pool.set_from_flat_data_page(start, torch.randn(page.shape, generator=gen).to(page.dtype))


def pages_of(pool: Any, indices: torch.Tensor) -> list[torch.Tensor]:
    """Copies of the pages that start at ``indices[::page]`` (flat, in the pool's page order)."""
    return [pool.get_data_page(start, flat=True).clone() for start in indices[:: pool.page_size].tolist()]

"""Validation of an engine's KV tensors (:mod:`.kv`) against a layout, before any copy touches them.

Primitives:
    check_kv: validate an engine KV against a layout for a number of chunks, naming the bad argument.
"""

from __future__ import annotations

import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout

from .kv import ContiguousKV, EngineKV, PagedKV
from .paged import check_planes


def _expect_shape(name: str, tensor: torch.Tensor, expected: tuple[int | None, ...]) -> None:
    ok = tensor.dim() == len(expected) and all(e is None or s == e for s, e in zip(tensor.shape, expected))
    if not ok:
        shown = tuple("*" if e is None else e for e in expected)
        raise InvalidArgumentError(name, f"has shape {tuple(tensor.shape)}, expected {shown}")


def check_kv(layout: KVLayout, kv: EngineKV, num_chunks: int, field: str = "kv") -> None:
    """Check that ``kv`` matches ``layout`` and holds the first ``num_chunks`` chunks.

    Raises:
        InvalidArgumentError: naming the offending argument (``kv.layers[3]``, ``kv.block_ids``, ...).
    """
    if not isinstance(kv, (ContiguousKV, PagedKV)):
        raise InvalidArgumentError(field, f"must be a ContiguousKV or PagedKV, got {type(kv).__name__}")
    if len(kv.layers) != layout.num_layers:
        raise InvalidArgumentError(
            f"{field}.layers", f"has {len(kv.layers)} layers, the layout {layout.num_layers}"
        )
    dtype = layout.dtype.torch_dtype
    device = kv.layers[0].device
    heads, dim, c_tokens = layout.num_kv_heads, layout.head_dim, layout.chunk_tokens
    for i, t in enumerate(kv.layers):
        name = f"{field}.layers[{i}]"
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(name, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.device != device:
            raise InvalidArgumentError(name, f"is on {t.device}, layer 0 on {device}")
        if isinstance(kv, PagedKV) and kv.raw:
            check_planes(layout, name, t)
            continue
        if t.dtype != dtype:
            raise InvalidArgumentError(name, f"has dtype {t.dtype}, the layout {dtype}")
        if isinstance(kv, ContiguousKV):
            _expect_shape(name, t, (None, dim) if layout.mla else (2, None, heads, dim))
            tokens = t.shape[0] if layout.mla else t.shape[1]
            if tokens < num_chunks * c_tokens:
                raise InvalidArgumentError(
                    name, f"holds {tokens} tokens, {num_chunks} chunks need {num_chunks * c_tokens}"
                )
        else:
            b = layout.page_tokens
            _expect_shape(name, t, (None, b, dim) if layout.mla else (2, None, b, heads, dim))
    if isinstance(kv, PagedKV):
        planes = [p for p in kv.planes if p is not None]
        if len(planes) != len(kv.planes):
            which = kv.planes.index(None)
            raise InvalidArgumentError(f"{field}.layers[{which}]", "a block is not contiguous in memory")
        num_blocks = planes[0].shape[1]
        if any(t.shape[1] != num_blocks for t in planes):
            raise InvalidArgumentError(f"{field}.layers", "layers differ in their number of blocks")
        need = num_chunks * (c_tokens // layout.page_tokens)
        if len(kv.block_ids) < need:
            raise InvalidArgumentError(
                f"{field}.block_ids", f"has {len(kv.block_ids)} blocks, {num_chunks} chunks need {need}"
            )
        outside = [b for b in kv.block_ids[:need] if not 0 <= b < num_blocks]
        if outside:
            raise InvalidArgumentError(f"{field}.block_ids", f"block {outside[0]} not in [0, {num_blocks})")

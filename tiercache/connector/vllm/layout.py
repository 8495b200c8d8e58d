"""vLLM's paged KV cache layouts: recognising them, and viewing a layer as block planes for the paged copy.

vLLM's attention backends lay out a layer's KV cache differently:

* CPU (``cpu``): ``[num_blocks, kv_heads, block_size, 2 * head_size]`` — one block of a layer is one
  contiguous slab (inside it K is stored transposed, then V);
* GPU flash-attention style (``flash``): ``[2, num_blocks, block_size, kv_heads, head_size]`` — K and V are
  two planes, a block of a layer is one contiguous run per plane.

Both are seen here as a byte tensor ``[planes, num_blocks, plane_block_bytes]`` (:func:`block_planes`), the
block planes of a :meth:`tiercache.connector.kv.PagedKV.of_blocks`: loads and saves move whole blocks with the
connector's one paged copy (:mod:`tiercache.connector.kv`), whatever the backend. For ``flash`` the chunk's
bytes are exactly the canonical ``[k|v][token][head][dim]`` of :mod:`tiercache.layout`; for ``cpu`` they are
the backend's own block bytes. The layout's name is part of the namespace (:mod:`.namespace`), so a chunk
saved by one backend never loads into another.

Primitives:
    BackendLayout: the known layouts (``cpu``, ``flash``) and how to recognise them from a tensor.
    check_cache: check a layer's cache against a layout (shape, dtype, whole blocks in memory order).
    block_planes: a layer's KV cache as ``[planes, num_blocks, plane_block_bytes]`` bytes (a view).
"""

from __future__ import annotations

import enum

import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout


class BackendLayout(enum.Enum):
    """How an attention backend lays out one layer's paged KV cache (the value goes into the namespace)."""

    CPU = "cpu"
    FLASH = "flash"

    @property
    def planes(self) -> int:
        """Planes a block is split into (1: one slab; 2: K and V apart)."""
        return 1 if self is BackendLayout.CPU else 2

    def expected_shape(self, num_blocks: int, layout: KVLayout) -> tuple[int, ...]:
        """The shape of one layer's cache under this layout."""
        h, b, d = layout.num_kv_heads, layout.page_tokens, layout.head_dim
        if self is BackendLayout.CPU:
            return (num_blocks, h, b, 2 * d)
        return (2, num_blocks, b, h, d)

    def num_blocks(self, tensor: torch.Tensor) -> int:
        """Blocks in a layer's cache."""
        return int(tensor.shape[0 if self is BackendLayout.CPU else 1])


def check_cache(kind: BackendLayout, layout: KVLayout, name: str, tensor: torch.Tensor) -> None:
    """Check that a layer's cache tensor has ``kind``'s shape for ``layout`` and whole blocks in memory order.

    Raises:
        InvalidArgumentError: naming the layer.
    """
    blocks = kind.num_blocks(tensor) if tensor.dim() == len(kind.expected_shape(0, layout)) else -1
    expected = kind.expected_shape(blocks, layout)
    if tuple(tensor.shape) != expected:
        raise InvalidArgumentError(
            name, f"has shape {tuple(tensor.shape)}, expected {expected} ({kind.value})"
        )
    if tensor.dtype != layout.dtype.torch_dtype:
        raise InvalidArgumentError(name, f"has dtype {tensor.dtype}, the namespace {layout.dtype.value}")
    inner = tensor[0] if kind is BackendLayout.CPU else tensor[0, 0]
    if not inner.is_contiguous():
        raise InvalidArgumentError(name, "a block is not contiguous in memory")


def block_planes(kind: BackendLayout, tensor: torch.Tensor) -> torch.Tensor:
    """A layer's cache as ``[planes, num_blocks, plane_block_bytes]`` uint8 (a view of the same memory)."""
    raw = tensor.view(torch.uint8)
    if kind is BackendLayout.CPU:
        return raw.flatten(1).unsqueeze(0)
    return raw.flatten(2)

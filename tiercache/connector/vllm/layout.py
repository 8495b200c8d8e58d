"""Copies between one layer of a chunk buffer and one layer of vLLM's paged KV cache, block by block.

vLLM's attention backends lay out a layer's KV cache differently:

* CPU (``cpu``): ``[num_blocks, kv_heads, block_size, 2 * head_size]`` — one block of a layer is one
  contiguous slab (inside it K is stored transposed, then V);
* GPU flash-attention style (``flash``): ``[2, num_blocks, block_size, kv_heads, head_size]`` — K and V are
  two planes, a block of a layer is one contiguous run per plane.

Both are seen here as a byte tensor ``[planes, num_blocks, plane_block_bytes]``, and a chunk's layer as
``[planes, blocks_per_chunk, plane_block_bytes]``: a load or save moves whole blocks, whatever the backend:
a save with one ``index_select`` per layer; a load with one single-threaded slice copy per run of
consecutive target blocks into a CPU cache (``index_copy_`` moves bytes one element at a time on the CPU:
20-25x slower; why single-threaded: :func:`copy_into_cache`), one ``index_copy_`` per layer into a GPU
cache. For ``flash`` the chunk's bytes are
exactly the canonical ``[k|v][token][head][dim]`` of :mod:`tiercache.layout`; for ``cpu`` they are the
backend's own block bytes. The layout's name is part of the namespace (:mod:`.namespace`), so a chunk saved
by one backend never loads into another.

Primitives:
    BackendLayout: the known layouts (``cpu``, ``flash``) and how to recognise them from a tensor.
    block_planes: a layer's KV cache as ``[planes, num_blocks, plane_block_bytes]`` bytes (a view).
    chunk_planes: one layer of a chunk buffer as ``[planes, blocks_per_chunk, plane_block_bytes]`` (a view).
    block_runs: consecutive block ids as ``(offset, first id, count)`` runs.
    copy_into_cache / copy_from_cache: move some blocks of one chunk and layer in or out.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
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


def chunk_planes(kind: BackendLayout, layout: KVLayout, buf: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer`` of a chunk buffer (1-D uint8) as ``[planes, blocks_per_chunk, plane_block_bytes]``."""
    start, stop = layout.layer_range(layer)
    per = layout.chunk_tokens // layout.page_tokens
    return buf[start:stop].view(kind.planes, per, -1)


def block_runs(block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """``block_ids`` as runs of consecutive ids: ``(offset in block_ids, first id, count)``, in order."""
    runs: list[tuple[int, int, int]] = []
    for offset, block in enumerate(block_ids):
        if runs and runs[-1][1] + runs[-1][2] == block:
            start, first, count = runs[-1]
            runs[-1] = (start, first, count + 1)
        else:
            runs.append((offset, block, 1))
    return runs


def copy_into_cache(cache: torch.Tensor, chunk: torch.Tensor, first: int, index: torch.Tensor) -> None:
    """Copy blocks ``first : first + len(index)`` of a chunk's layer (``chunk_planes``) into the cache blocks
    ``index`` (int64, on the cache's device).

    Into a CPU cache: one slice copy per run of consecutive blocks (memcpy speed; ``index_copy_`` on these
    byte tensors copies element by element: 0.8 ms against 0.03 ms for 8 blocks of 64 KiB on one core, and
    slower still with more threads), made by numpy on the calling thread: torch's ``copy_`` splits a large
    copy over its OpenMP threads, and on a busy machine one descheduled thread stalls the whole copy
    (measured on the loaded 2-core machine, the 32 MiB of a 4K-token prompt: torch median 44 ms, worst
    500 ms; numpy median 7.5 ms, worst 16 ms; best 4.9 against 5.9 ms). A chunk on another device (host shared memory for a GPU cache) is
    staged onto the cache's device first (asynchronously, on the current stream) and scattered with one
    ``index_copy_``.
    """
    src = chunk[:, first : first + index.numel()]
    if src.device == cache.device and cache.device.type == "cpu":
        dst, chunk_bytes = cache.numpy(), src.numpy()
        for offset, block, count in block_runs(index.tolist()):
            np.copyto(dst[:, block : block + count], chunk_bytes[:, offset : offset + count])
        return
    if src.device != cache.device:
        src = src.to(cache.device, non_blocking=True)
    cache.index_copy_(1, index, src)


def copy_from_cache(cache: torch.Tensor, chunk: torch.Tensor, first: int, index: torch.Tensor) -> None:
    """Copy the cache blocks ``index`` into blocks ``first : first + len(index)`` of a chunk's layer.

    On CUDA the device-to-host copy is asynchronous on the current stream: synchronize before the chunk is
    published.
    """
    dst = chunk[:, first : first + index.numel()]
    if dst.device == cache.device and dst.is_contiguous():
        torch.index_select(cache, 1, index, out=dst)
        return
    dst.copy_(torch.index_select(cache, 1, index), non_blocking=dst.device.type == "cpu")

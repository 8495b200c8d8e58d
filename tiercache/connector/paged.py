"""Block copies of a paged KV cache: each layer seen as block planes, moved block run by block run.

A paged cache keeps each layer as blocks of ``page_tokens`` tokens; whatever the engine's layout, a block of a
layer is ``planes`` contiguous runs of bytes (vLLM's GPU layout: K and V, two planes; its CPU layout and MLA:
one). Seen as ``[planes, num_blocks, plane_block_bytes]`` bytes, a chunk's layer in a chunk buffer is its
blocks' planes in order, ``[planes, blocks_per_chunk, plane_block_bytes]``, so one copy routine serves every
layout: :func:`copy_blocks`.

Primitives:
    layer_planes: a ``[2, N, B, H, D]`` (MLA ``[N, B, D]``) layer as block planes (a view), or None.
    check_planes: a layer given as block planes holds whole blocks of the layout's size.
    chunk_layer_planes: one layer of a chunk buffer as block planes.
    block_runs: consecutive block ids as ``(offset, first id, count)`` runs.
    copy_blocks: move some blocks of one chunk's layer in or out of the cache.
    copy_host_chunk: move layers of a chunk in or out of a host cache through numpy views made once.
    host_bytes: a host tensor's bytes as a numpy view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout


def layer_planes(layer: object) -> torch.Tensor | None:
    """A paged layer (``[2, N, B, H, D]``, MLA ``[N, B, D]``) as ``[planes, N, plane_block_bytes]`` bytes (a
    view), or None where it has no such view (not such a tensor, or a block is not contiguous in memory:
    :func:`~.kv_check.check_kv` says which)."""
    if not isinstance(layer, torch.Tensor) or layer.dim() not in (3, 5) or layer.stride(-1) != 1:
        return None
    try:
        raw = layer.view(torch.uint8)
        if layer.dim() == 3:
            return raw.view(1, raw.shape[0], -1)
        return raw.view(raw.shape[0], raw.shape[1], -1)
    except RuntimeError:
        return None


def check_planes(layout: KVLayout, name: str, t: torch.Tensor) -> None:
    """A layer given as block planes holds whole blocks of the layout's size."""
    per = layout.chunk_tokens // layout.page_tokens
    if t.dtype != torch.uint8 or t.dim() != 3 or t.shape[0] * t.shape[2] * per != layout.layer_bytes:
        raise InvalidArgumentError(
            name,
            f"must be [planes, num_blocks, plane_block_bytes] uint8 with {layout.layer_bytes // per} bytes per "
            f"block, got {t.dtype} {tuple(t.shape)}",
        )


def chunk_layer_planes(layout: KVLayout, buf: torch.Tensor, layer: int, planes: int) -> torch.Tensor:
    """Layer ``layer`` of a chunk buffer (1-D uint8) as ``[planes, blocks_per_chunk, plane_block_bytes]``."""
    start, stop = layout.layer_range(layer)
    return buf[start:stop].view(planes, layout.chunk_tokens // layout.page_tokens, -1)


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


def copy_blocks(
    cache: torch.Tensor,
    part: torch.Tensor,
    blocks: Sequence[int],
    index: Callable[[], torch.Tensor],
    into_kv: bool,
    non_blocking: bool = False,
) -> None:
    """Move ``part`` (``[planes, len(blocks), plane_block_bytes]``, a chunk's layer or some of its blocks)
    into (``into_kv``) or out of the cache blocks ``blocks`` (``cache``: ``[planes, num_blocks,
    plane_block_bytes]``); ``index`` gives ``blocks`` as an int64 tensor on the cache's device (asked only for
    scattered blocks on one device).

    Between host tensors: one numpy copy per run of consecutive blocks, on the calling thread (``index_copy_``
    on byte tensors copies element by element: 0.8 ms against 0.03 ms for 8 blocks of 64 KiB on one core, and
    torch's ``copy_`` splits a large copy over its OpenMP threads, where one descheduled thread stalls the
    whole copy on a busy machine). On one device: one ``index_copy_`` / ``index_select`` for scattered
    blocks. Across devices: one copy per run (``non_blocking``: queued on the current CUDA stream).
    """
    runs = block_runs(blocks)
    host = host_bytes(cache) if part.device == cache.device else None
    if host is not None:
        _copy_host_runs(host, part.detach().numpy(), runs, into_kv)
        return
    if len(runs) > 1 and part.device == cache.device:
        if into_kv:
            cache.index_copy_(1, index(), part)
        elif part.is_contiguous():
            torch.index_select(cache, 1, index(), out=part)
        else:
            part.copy_(torch.index_select(cache, 1, index()))
        return
    for offset, block, count in runs:
        if into_kv:
            cache[:, block : block + count].copy_(part[:, offset : offset + count], non_blocking=non_blocking)
        else:
            part[:, offset : offset + count].copy_(cache[:, block : block + count], non_blocking=non_blocking)


def copy_host_chunk(
    layout: KVLayout,
    hosts: Sequence[np.ndarray],
    chunk_bytes: np.ndarray,
    first: int,
    blocks: Sequence[int],
    layers: Iterable[int],
    into_kv: bool,
) -> None:
    """Move a chunk's ``layers`` between its buffer's bytes (1-D) and the host cache blocks ``blocks`` (the
    chunk's blocks from position ``first`` on; ``hosts``: each layer's ``[planes, num_blocks,
    plane_block_bytes]`` bytes), one numpy copy per run of consecutive blocks. With the views made once by the
    caller, the per-layer tensor views and conversions of :func:`copy_blocks` (~40 us a layer, 4x the copy of
    a 64 KiB layer: a 23-chunk load of the serve bench's model took 4.7 ms against 1.0 ms of copies) are gone.
    """
    if not blocks:
        return
    runs = block_runs(blocks)
    per, size = layout.chunk_tokens // layout.page_tokens, layout.layer_bytes
    for layer in layers:
        host = hosts[layer]
        part = chunk_bytes[layer * size : (layer + 1) * size].reshape(host.shape[0], per, -1)
        _copy_host_runs(host, part[:, first : first + len(blocks)], runs, into_kv)


def _copy_host_runs(
    host: np.ndarray, part: np.ndarray, runs: Sequence[tuple[int, int, int]], into_kv: bool
) -> None:
    """One numpy copy per run (:func:`block_runs`) between a chunk layer's blocks ``part`` and the host cache
    ``host`` (both ``[planes, blocks, plane_block_bytes]``)."""
    for offset, block, count in runs:
        if into_kv:
            np.copyto(host[:, block : block + count], part[:, offset : offset + count])
        else:
            np.copyto(part[:, offset : offset + count], host[:, block : block + count])


def host_bytes(tensor: torch.Tensor) -> np.ndarray | None:
    """A host tensor's bytes as a numpy array of the same layout (a view), or None where there is no such
    view (not on the CPU, or its last dimension is strided)."""
    if tensor.device.type != "cpu" or (tensor.dim() > 0 and tensor.stride(-1) != 1):
        return None
    return tensor.detach().view(torch.uint8).numpy()

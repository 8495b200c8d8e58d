"""Copies between chunk buffers (layer-major bytes) and the engine's own KV tensors.

Two engine layouts are supported:

* :class:`ContiguousKV` — one tensor per layer, ``[2, tokens, kv_heads, head_dim]`` (MLA: ``[tokens, dim]``);
  chunk ``i`` is tokens ``[i * C, (i + 1) * C)``.
* :class:`PagedKV` — a paged cache: one tensor per layer, ``[2, num_blocks, block_size, kv_heads,
  head_dim]`` (vLLM's GPU layout; MLA: ``[num_blocks, block_size, dim]``) with ``block_size ==
  layout.page_tokens``, or (:meth:`PagedKV.of_blocks`) any layout whose block of a layer is ``planes``
  contiguous runs of bytes, given as ``[planes, num_blocks, plane_block_bytes]`` (vLLM's CPU layout: one
  plane); plus the request's block ids: chunk ``i`` covers ``block_ids[i * C/B : (i + 1) * C/B]`` (the last
  chunk may have only its first blocks), and a load writes no block before ``first_block``.

Each (chunk, layer) moves with one copy straight between the chunk buffer (e.g. a shared-memory slot) and
the engine tensor. A paged layer is moved as block planes (:mod:`.paged`). No intermediate buffers.

A request's chunks usually sit in slots at a constant distance from each other (consecutive slots of one
store): the data plane views such slots as runs, one strided ``[n, chunk_bytes]`` view each
(``SlotAccess.runs`` of :mod:`.segments`), and :func:`run_to_kv` / :func:`kv_to_run` move a whole run of a
contiguous KV with one copy per layer (a paged KV still moves chunk by chunk). The per-request cost is then
a few C-speed copies, not Python per chunk. Between host tensors those copies go through numpy (see
:func:`_copy_host`): one thread per copy, and for a large run every other layer on a caller's helper thread,
since one thread reaches only about half of the machine's copy bandwidth.

Primitives:
    ContiguousKV, PagedKV, EngineKV: the engine's tensors (``PagedKV.of_blocks``: a paged cache given as
        block planes).
    (check_kv, in :mod:`.kv_check`, validates an engine KV against a layout.)
    chunk_to_kv / kv_to_chunk: copy one chunk (all layers, or one layer) in or out.
    chunks_to_kv: copy one layer of many chunks in.
    chunk_spans: a contiguous CPU KV as byte arrays of the engine's memory, one per layer's K and V.
    chunk_parts: the chunks of a contiguous CPU KV as views of the engine's memory (no copy).
    run_to_kv / kv_to_run: copy a run of consecutive chunks in or out (one copy per layer).
    SPLIT_MIN_BYTES: the smallest run whose copy is split over a helper thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout

from .paged import chunk_layer_planes, copy_blocks, copy_host_chunk, host_bytes, layer_planes


@dataclass(frozen=True, slots=True, eq=False)
class ContiguousKV:
    """Per-layer contiguous KV tensors of one request.

    Attributes:
        layers: one tensor per layer, ``[2, tokens, kv_heads, head_dim]`` (MLA ``[tokens, head_dim]``).
    """

    layers: tuple[torch.Tensor, ...]

    def __init__(self, layers: Sequence[torch.Tensor]) -> None:
        object.__setattr__(self, "layers", tuple(layers))


@dataclass(frozen=True, slots=True, eq=False)
class PagedKV:
    """A paged KV buffer and the blocks of one request.

    Attributes:
        layers: one tensor per layer, ``[2, num_blocks, block_size, kv_heads, head_dim]`` (MLA
            ``[num_blocks, block_size, head_dim]``); from :meth:`of_blocks`, the block planes themselves.
        block_ids: the request's blocks, in token order.
        first_block: a load writes no block before this one (the engine computed them).
        planes: each layer as ``[planes, num_blocks, plane_block_bytes]`` uint8 (views of ``layers``; None for a
            layer without such a view, which :func:`~.kv_check.check_kv` refuses).
        raw: made by :meth:`of_blocks` (``layers`` are byte planes in the engine's own block layout).
    """

    layers: tuple[torch.Tensor, ...]
    block_ids: tuple[int, ...]
    first_block: int
    planes: tuple[torch.Tensor | None, ...]
    raw: bool
    _index_cache: dict[tuple[int, str], torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _host_cache: list[tuple[np.ndarray, ...] | None] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def __init__(
        self,
        layers: Sequence[torch.Tensor],
        block_ids: Sequence[int],
        first_block: int = 0,
        raw: bool = False,
    ) -> None:
        object.__setattr__(self, "layers", tuple(layers))
        object.__setattr__(self, "block_ids", tuple(int(b) for b in block_ids))
        object.__setattr__(self, "first_block", int(first_block))
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "planes", tuple(t if raw else layer_planes(t) for t in self.layers))
        object.__setattr__(self, "_index_cache", {})
        object.__setattr__(self, "_host_cache", [])

    @classmethod
    def of_blocks(
        cls, planes: Sequence[torch.Tensor], block_ids: Sequence[int], first_block: int = 0
    ) -> PagedKV:
        """A paged cache given as block planes: per layer ``[planes, num_blocks, plane_block_bytes]`` uint8,
        where block ``b`` of a layer is ``[p, b]`` for every plane ``p`` and a chunk's layer in a chunk buffer
        is its blocks' planes in order (``[planes, blocks_per_chunk, plane_block_bytes]``)."""
        return cls(planes, block_ids, first_block, raw=True)

    def chunk_blocks(self, layout: KVLayout, chunk: int) -> tuple[int, ...]:
        """The block ids chunk ``chunk`` covers (fewer than a chunk's for a last chunk loaded in part)."""
        per = layout.chunk_tokens // layout.page_tokens
        return self.block_ids[chunk * per : (chunk + 1) * per]

    def written_blocks(self, layout: KVLayout, chunk: int) -> tuple[int, tuple[int, ...]]:
        """The blocks of chunk ``chunk`` a load writes: (the first one's position in the chunk, their ids)."""
        per = layout.chunk_tokens // layout.page_tokens
        skip = min(max(0, self.first_block - chunk * per), per)
        return skip, self.chunk_blocks(layout, chunk)[skip:]

    def host_planes(self) -> tuple[np.ndarray, ...] | None:
        """Every layer's planes as numpy views of host memory (made once), or None when one is not on the
        host or has no such view."""
        if not self._host_cache:
            views = [None if p is None else host_bytes(p) for p in self.planes]
            self._host_cache.append(
                None if any(v is None for v in views) else tuple(v for v in views if v is not None)
            )
        return self._host_cache[0]

    def chunk_index(self, layout: KVLayout, chunk: int, device: torch.device, into_kv: bool) -> torch.Tensor:
        """The block ids a copy of the chunk moves, as an int64 tensor on ``device`` (cached)."""
        key = (chunk * 2 + into_kv, str(device))
        idx = self._index_cache.get(key)
        if idx is None:
            blocks = self.written_blocks(layout, chunk)[1] if into_kv else self.chunk_blocks(layout, chunk)
            idx = torch.tensor(blocks, dtype=torch.int64, device=device)
            self._index_cache[key] = idx
        return idx


EngineKV = ContiguousKV | PagedKV


def _engine_slice(layout: KVLayout, tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``tensor[start:stop]`` along the token/block axis (dim 0 for MLA, else dim 1)."""
    return tensor[start:stop] if layout.mla else tensor[:, start:stop]


def _copy_layer(
    layout: KVLayout,
    kv: EngineKV,
    chunk: int,
    layer: int,
    buf: torch.Tensor,
    into_kv: bool,
    non_blocking: bool = False,
) -> None:
    if isinstance(kv, PagedKV):
        cache = kv.planes[layer]
        assert cache is not None, "a PagedKV not checked with check_kv"
        first, blocks = kv.written_blocks(layout, chunk) if into_kv else (0, kv.chunk_blocks(layout, chunk))
        if blocks:
            part = chunk_layer_planes(layout, buf, layer, cache.shape[0])[:, first : first + len(blocks)]
            index = partial(kv.chunk_index, layout, chunk, cache.device, into_kv)
            copy_blocks(cache, part, blocks, index, into_kv, non_blocking)
        return
    src_or_dst = layout.layer_view(buf, layer)
    c = layout.chunk_tokens
    target = _engine_slice(layout, kv.layers[layer], chunk * c, (chunk + 1) * c)
    if into_kv:
        target.copy_(src_or_dst, non_blocking=non_blocking)
    else:
        src_or_dst.copy_(target)


def _copy_chunk(
    layout: KVLayout,
    kv: EngineKV,
    chunk: int,
    buf: torch.Tensor,
    layers: Sequence[int] | None,
    into_kv: bool,
    non_blocking: bool,
) -> None:
    """Move the chunk's layers between ``buf`` and the engine's tensors: a host paged cache and a host buffer
    through numpy views (:func:`~.paged.copy_host_chunk`), anything else layer by layer."""
    order = range(layout.num_layers) if layers is None else layers
    hosts = kv.host_planes() if isinstance(kv, PagedKV) and buf.device.type == "cpu" else None
    if hosts is None:
        for layer in order:
            _copy_layer(layout, kv, chunk, layer, buf, into_kv, non_blocking)
        return
    assert isinstance(kv, PagedKV)
    if layers is not None:
        for layer in layers:
            layout.layer_range(layer)  # (checks it: the host path indexes the layers' views with it)
    first, blocks = kv.written_blocks(layout, chunk) if into_kv else (0, kv.chunk_blocks(layout, chunk))
    copy_host_chunk(layout, hosts, buf.detach().numpy(), first, blocks, order, into_kv)


def chunks_to_kv(
    layout: KVLayout, chunks: Sequence[tuple[int, torch.Tensor]], kv: EngineKV, layer: int
) -> None:
    """Copy one layer of many chunks (``(position in the request, chunk buffer)``) into the engine's tensors
    on the calling thread, as :func:`chunk_to_kv` does chunk by chunk, with the host paged cache's numpy
    views looked up once (a layer-by-layer load of 23 chunks of the serve bench's model: 2.2 ms against
    2.6 ms chunk by chunk, and 5.0 ms before the host path).

    Raises:
        InvalidArgumentError: a chunk buffer has the wrong dtype, rank or size, or ``layer`` is out of range.
    """
    layout.layer_range(layer)  # (checks it)
    hosts = kv.host_planes() if isinstance(kv, PagedKV) else None
    if hosts is None or any(buf.device.type != "cpu" for _, buf in chunks):
        for index, buf in chunks:
            chunk_to_kv(layout, buf, kv, index, layers=(layer,))
        return
    assert isinstance(kv, PagedKV)
    for index, buf in chunks:
        layout.check_buffer(buf, field="chunk_buf")
        first, blocks = kv.written_blocks(layout, index)
        copy_host_chunk(layout, hosts, buf.detach().numpy(), first, blocks, (layer,), True)


def chunk_to_kv(
    layout: KVLayout,
    chunk_buf: torch.Tensor,
    kv: EngineKV,
    chunk: int,
    layers: Sequence[int] | None = None,
    non_blocking: bool = False,
) -> None:
    """Copy chunk ``chunk`` from a chunk buffer into the engine's tensors.

    Args:
        layout: the KV layout.
        chunk_buf: 1-D ``uint8`` tensor of ``layout.chunk_bytes`` (layer-major), e.g. a shared-memory slot.
        kv: the engine's tensors (validated with :func:`~.kv_check.check_kv` for at least ``chunk + 1`` chunks).
        chunk: position of the chunk in the request.
        layers: the layers to copy (default all), e.g. one at a time for layerwise loading.
        non_blocking: queue host-to-device copies on the current CUDA stream without waiting; from pinned
            memory they are then truly asynchronous and ``chunk_buf`` must stay valid until the stream has
            passed them (synchronize before it is released or reused).

    Raises:
        InvalidArgumentError: ``chunk_buf`` has the wrong dtype, rank or size, or a layer is out of range.
    """
    layout.check_buffer(chunk_buf, field="chunk_buf")
    _copy_chunk(layout, kv, chunk, chunk_buf, layers, into_kv=True, non_blocking=non_blocking)


def kv_to_chunk(
    layout: KVLayout,
    kv: EngineKV,
    chunk: int,
    chunk_buf: torch.Tensor,
    layers: Sequence[int] | None = None,
    non_blocking: bool = False,
) -> None:
    """Copy chunk ``chunk`` of the engine's tensors into a chunk buffer (layer-major).

    Args:
        layout: the KV layout.
        kv: the engine's tensors (validated with :func:`~.kv_check.check_kv` for at least ``chunk + 1`` chunks).
        chunk: position of the chunk in the request.
        chunk_buf: 1-D ``uint8`` tensor of ``layout.chunk_bytes``, e.g. a shared-memory slot.
        layers: the layers to copy (default all).
        non_blocking: from a CUDA paged cache, queue the device-to-host copies on the current stream without
            waiting (synchronize it before the chunk is read).

    Raises:
        InvalidArgumentError: ``chunk_buf`` has the wrong dtype, rank or size, or a layer is out of range.
    """
    layout.check_buffer(chunk_buf, field="chunk_buf")
    _copy_chunk(layout, kv, chunk, chunk_buf, layers, into_kv=False, non_blocking=non_blocking)


def chunk_spans(layout: KVLayout, kv: EngineKV) -> tuple[np.ndarray, ...] | None:
    """The engine's KV as byte spans, one per layer's K and V (MLA: one per layer), in chunk-buffer order,
    when each is one contiguous span of CPU memory of the layout's dtype (a :class:`ContiguousKV` of
    contiguous CPU tensors); else None. Chunk ``i``'s bytes are ``span[i * p:(i + 1) * p]`` of every span in
    order, with ``p = layout.chunk_bytes // len(spans)`` (views of the engine's memory, no copy).
    """
    if not isinstance(kv, ContiguousKV) or len(kv.layers) != layout.num_layers:
        return None
    row = (layout.head_dim,) if layout.mla else (layout.num_kv_heads, layout.head_dim)
    spans: list[np.ndarray] = []
    for tensor in kv.layers:
        if tensor.device.type != "cpu" or tensor.dtype != layout.dtype.torch_dtype:
            return None
        if tensor.dim() != 1 + len(row) + (not layout.mla) or (not layout.mla and tensor.shape[0] != 2):
            return None
        for span in (tensor,) if layout.mla else (tensor[0], tensor[1]):
            if tuple(span.shape[1:]) != row or not span.is_contiguous():
                return None
            spans.append(span.detach().view(torch.uint8).reshape(-1).numpy())
    return tuple(spans)


def chunk_parts(layout: KVLayout, kv: EngineKV) -> Callable[[int], tuple[memoryview, ...]] | None:
    """Chunks of the engine's tensors as views of them, in chunk-buffer order (no copy): a chunk's K and V
    of every layer (MLA: its rows of every layer), when the KV has :func:`chunk_spans`; else None (chunks
    must be gathered with :func:`kv_to_chunk`). The byte stream writes such chunks straight from the
    engine's memory. Checked once: a chunk's parts are then slices of the spans (no tensor op per chunk).

    Returns:
        chunk position -> its parts (the caller checked the KV with :func:`~.kv_check.check_kv` for those chunks).
    """
    arrays = chunk_spans(layout, kv)
    if arrays is None:
        return None
    spans = [array.data for array in arrays]
    part = layout.chunk_bytes // len(spans)

    def parts(chunk: int) -> tuple[memoryview, ...]:
        return tuple(span[chunk * part : (chunk + 1) * part] for span in spans)

    return parts


def _run_layers(layout: KVLayout, run: torch.Tensor) -> torch.Tensor:
    """A run ``[n, chunk_bytes]`` typed as ``[n, layers, *layer_shape]`` (a view)."""
    if run.dtype != torch.uint8 or run.dim() != 2 or run.shape[1] != layout.chunk_bytes:
        raise InvalidArgumentError(
            "run", f"must be a [n, {layout.chunk_bytes}] uint8 tensor, got {run.dtype} {tuple(run.shape)}"
        )
    return run.view(layout.dtype.torch_dtype).view(run.shape[0], layout.num_layers, *layout.layer_shape)


def _run_engine_view(layout: KVLayout, tensor: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """Chunks ``[first, first + n)`` of a contiguous KV layer as ``[n, *layer_shape]`` (a view)."""
    c = layout.chunk_tokens
    part = _engine_slice(layout, tensor, first * c, (first + n) * c)
    if layout.mla:
        return part.view(n, c, *part.shape[1:])
    return part.view(part.shape[0], n, c, *part.shape[2:]).transpose(0, 1)


SPLIT_MIN_BYTES = 16 * 1024 * 1024
"""Smallest run whose host copy is split over two threads: below it, handing half the layers to another
thread saved nothing measurable (compare's 12 MiB requests), above it two threads copy 1.3-1.5x faster than
one on a quiet 2-core host (7b and tiny runs)."""


def _move_run(
    layout: KVLayout,
    run: torch.Tensor,
    kv: EngineKV,
    first: int,
    layers: Sequence[int] | None,
    into_kv: bool,
    helper: Executor | None,
) -> None:
    n = run.shape[0]
    # Host-to-device: queue every copy, then wait once (from pinned memory they overlap; the caller's buffer
    # may be released as soon as this returns). Each source is one chunk's contiguous layer: a strided
    # host source would be staged through a pageable temporary first.
    to_device = into_kv and run.device.type == "cpu" and kv.layers[0].device.type == "cuda"
    if isinstance(kv, PagedKV) or to_device:
        for i in range(n):
            for layer in range(layout.num_layers) if layers is None else layers:
                _copy_layer(layout, kv, first + i, layer, run[i], into_kv, non_blocking=to_device)
        if to_device:
            torch.cuda.current_stream(kv.layers[0].device).synchronize()
        return
    typed = _run_layers(layout, run)
    chosen = list(range(layout.num_layers) if layers is None else layers)
    for layer in chosen:
        layout.layer_range(layer)  # validates the index

    def move(some: Sequence[int]) -> None:
        for layer in some:
            chunks = typed[:, layer]
            engine = _run_engine_view(layout, kv.layers[layer], first, n)
            if into_kv:
                _copy_host(engine, chunks)
            else:
                _copy_host(chunks, engine)

    if helper is None or len(chosen) < 2 or run.nbytes < SPLIT_MIN_BYTES:
        move(chosen)
        return
    # Every other layer on the helper's thread while this one does the rest: numpy's one-thread copy
    # reaches about half of the machine's copy bandwidth, torch's own split (OpenMP) stalls on a busy host.
    other = helper.submit(move, chosen[1::2])
    try:
        move(chosen[0::2])
    finally:
        other.result()  # never return while the helper still touches the run (its slots may be released)


def _copy_host(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` of same-shape, same-dtype tensors; between host tensors through numpy, one thread.

    Why: torch splits a strided copy over its intra-op threads, and on a busy host (more runnable threads
    than cores) that split copy ran at a third to a quarter of one thread's speed (the 7b layout's store and
    load through shared memory); numpy copies the same strided views in one thread at memcpy speed, without
    holding the GIL. The bytes are the same either way.
    """
    dst_bytes, src_bytes = host_bytes(dst), host_bytes(src)
    if dst_bytes is None or src_bytes is None or dst.dtype != src.dtype or dst.shape != src.shape:
        dst.copy_(src)
    else:
        np.copyto(dst_bytes, src_bytes)


def run_to_kv(
    layout: KVLayout,
    run: torch.Tensor,
    kv: EngineKV,
    first: int,
    layers: Sequence[int] | None = None,
    helper: Executor | None = None,
) -> None:
    """Copy a run of chunks (``[n, chunk_bytes]``, e.g. from ``SlotAccess.runs``) into the engine's tensors:
    chunk ``first + i`` from ``run[i]``, one copy per layer for a contiguous KV on the host. Into a CUDA
    engine, every (chunk, layer) copy is queued without waiting on the current stream and the stream is
    synchronized once at the end (from a pinned segment the copies run at the link's pinned peak); ``run`` may
    be released when this returns.
    With a ``helper`` (one worker thread), a host run of at least :data:`SPLIT_MIN_BYTES` has every other
    layer copied on the helper's thread meanwhile.

    Raises:
        InvalidArgumentError: ``run`` is not ``[n, chunk_bytes]`` uint8, or a layer is out of range.
    """
    _move_run(layout, run, kv, first, layers, True, helper)


def kv_to_run(
    layout: KVLayout,
    kv: EngineKV,
    first: int,
    run: torch.Tensor,
    layers: Sequence[int] | None = None,
    helper: Executor | None = None,
) -> None:
    """Copy chunks ``first, first + 1, ...`` of the engine's tensors into a run of chunk buffers
    (``[n, chunk_bytes]``, e.g. from ``SlotAccess.runs``), one copy per layer for a contiguous KV (split with
    a ``helper`` as in :func:`run_to_kv`).

    Raises:
        InvalidArgumentError: ``run`` is not ``[n, chunk_bytes]`` uint8, or a layer is out of range.
    """
    _move_run(layout, run, kv, first, layers, False, helper)

"""SGLang's host KV pool seen as chunks: one SGLang page is one tiercache chunk, moved as block planes.

SGLang's host pool (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``) keeps one ``kv_buffer`` whose
layout the server chooses (``--hicache-mem-layout``). Each supported layout gives every page of the pool a
fixed set of contiguous byte runs, so the pool is handed to the transfer stack as
:meth:`~tiercache.connector.kv.PagedKV.of_blocks` block planes (``[planes, num_pages, plane_block_bytes]``
per chunk layer) and every copy goes straight between a daemon slot and the pool's page:

* ``layer_first`` (``[2, layers, tokens, heads, dim]``; MLA ``[layers, tokens, 1, dim]``) and
  ``page_first_direct`` (``[2, pages, layers, page, heads, dim]``; MLA ``[pages, layers, page, 1, dim]``):
  a page's layer is K and V of ``page`` tokens, so the chunk is tiercache's own layer-major layout
  (:class:`ChunkOrder.LAYER_MAJOR`); the two layouts share chunks.
* ``page_first`` (``[2, tokens, layers, heads, dim]``; MLA ``[tokens, layers, 1, dim]``): a page is K then V
  of ``page`` tokens of every layer, one contiguous run each, so the chunk is that run
  (:class:`ChunkOrder.TOKEN_MAJOR`): its layout is one "layer" of ``layers * heads`` heads (MLA: a latent of
  ``layers * dim``). One copy per page and plane, at memcpy speed; the namespace keeps it apart.

``page_head``, ``page_unified``, split K/V buffers and decode context parallelism are refused by name.

SGLang's legacy calls (``get`` / ``set``) carry a page as a flat tensor in the pool's own page order
(``get_data_page``), which is ``[planes, chunk layers, plane_block_bytes]`` in every supported layout:
:meth:`HostPages.flat_planes` views stacked flat pages as block planes too.

Primitives:
    ChunkOrder: the byte order of a chunk (layer-major or token-major), part of the namespace.
    HostPages: a registered pool's chunk layout, block planes and page numbering.
    host_pages: build it from an SGLang host pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype, KVLayout

from ..kv import PagedKV


class ChunkOrder(Enum):
    """Byte order of an SGLang page stored as a chunk (the value goes into the namespace)."""

    LAYER_MAJOR = "layer_major"
    """``[layer][k|v][token][head][dim]``: ``layer_first`` and ``page_first_direct`` pools."""
    TOKEN_MAJOR = "token_major"
    """``[k|v][token][layer][head][dim]``: ``page_first`` pools."""


_ORDERS = {
    "layer_first": ChunkOrder.LAYER_MAJOR,
    "page_first_direct": ChunkOrder.LAYER_MAJOR,
    "page_first": ChunkOrder.TOKEN_MAJOR,
}


@dataclass(frozen=True, slots=True)
class HostPages:
    """A registered host pool as chunks.

    Attributes:
        layout: the chunk layout (one page per chunk: ``chunk_tokens == page_tokens`` == SGLang's page size).
        order: the chunk's byte order.
        host_layout: the pool's layout name (``layer_first``, ``page_first``, ``page_first_direct``).
        planes: per chunk layer, the pool as ``[planes, num_pages, plane_block_bytes]`` uint8 (views).
        page_size: tokens per page.
        num_pages: pages in the pool.
    """

    layout: KVLayout
    order: ChunkOrder
    host_layout: str
    planes: tuple[torch.Tensor, ...]
    page_size: int
    num_pages: int

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (one chunk)."""
        return self.layout.chunk_bytes

    def page_ids(self, host_indices: torch.Tensor, count: int) -> list[int]:
        """The pages of ``count`` keys' host slots (``count * page_size`` token slots, page ``i`` starting at
        ``host_indices[i * page_size]``).

        Raises:
            InvalidArgumentError: ``host_indices`` has the wrong length, or a page start is not the first slot
                of a page of this pool.
        """
        if host_indices.dim() != 1 or host_indices.numel() != count * self.page_size:
            raise InvalidArgumentError(
                "host_indices",
                f"holds {host_indices.numel()} slots, {count} pages of {self.page_size} need "
                f"{count * self.page_size}",
            )
        starts = host_indices[:: self.page_size].tolist()
        pages: list[int] = []
        for start in starts:
            page, offset = divmod(int(start), self.page_size)
            if offset or not 0 <= page < self.num_pages:
                raise InvalidArgumentError(
                    "host_indices", f"slot {start} is not the start of a page of this pool"
                )
            pages.append(page)
        return pages

    def pool_kv(self, pages: Sequence[int]) -> PagedKV:
        """The pool's ``pages`` as the transfer stack's paged KV (chunk ``i`` is page ``pages[i]``)."""
        return PagedKV.of_blocks(self.planes, pages)

    def flat_planes(self, flat: torch.Tensor) -> PagedKV:
        """Stacked flat pages (``[n, page_bytes]`` uint8, each in ``get_data_page`` order) as a paged KV
        whose chunk ``i`` is row ``i``."""
        n = flat.shape[0]
        layers = self.layout.num_layers
        per_plane = flat.view(n, self.layout.kv_planes, layers, -1)
        return PagedKV.of_blocks([per_plane[:, :, i].transpose(0, 1) for i in range(layers)], range(n))


def _refuse(field: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"mem_pool_host.{field}", message)


def host_pages(pool: Any, mla: bool) -> HostPages:
    """The chunks of SGLang host pool ``pool`` (MLA when ``mla``).

    Raises:
        InvalidArgumentError: naming the pool's attribute, for a layout, dtype, buffer or page geometry this
            backend does not move.
    """
    host_layout = str(getattr(pool, "layout", ""))
    order = _ORDERS.get(host_layout)
    if order is None:
        raise _refuse("layout", f"{host_layout!r} is not supported; valid: {', '.join(_ORDERS)}")
    buffer = getattr(pool, "kv_buffer", None)
    if not isinstance(buffer, torch.Tensor) or not buffer.is_contiguous():
        raise _refuse("kv_buffer", "must be one contiguous tensor (split K/V buffers are not supported)")
    if int(getattr(pool, "dcp_size", 1)) != 1:
        raise _refuse("dcp_size", "decode context parallelism is not supported")
    dtype = KVDtype.from_torch(buffer.dtype)
    page = int(pool.page_size)
    if not mla and int(getattr(pool, "v_head_dim", pool.head_dim)) != int(pool.head_dim):
        raise _refuse("v_head_dim", "K and V heads of different sizes are not supported")
    kv = buffer.unsqueeze(0) if mla else buffer  # a planes axis of 1 for MLA's latent
    direct = host_layout == "page_first_direct"
    expected = 6 if direct else 5
    if kv.dim() != expected or kv.shape[0] != (1 if mla else 2):
        raise _refuse("kv_buffer", f"has shape {tuple(buffer.shape)}, not a {host_layout} KV buffer")
    planes = kv.shape[0]
    if direct:
        num_pages, layers, heads, dim = kv.shape[1], kv.shape[2], kv.shape[4], kv.shape[5]
        if kv.shape[3] != page:
            raise _refuse("page_size", f"{page} does not match the buffer's pages of {kv.shape[3]}")
    else:
        tokens = kv.shape[2] if host_layout == "layer_first" else kv.shape[1]
        layers = kv.shape[1] if host_layout == "layer_first" else kv.shape[2]
        heads, dim = kv.shape[3], kv.shape[4]
        if tokens % page:
            raise _refuse("page_size", f"{tokens} host slots are not whole pages of {page}")
        num_pages = tokens // page
    raw = kv.view(torch.uint8)
    if host_layout == "layer_first":
        blocks = raw.reshape(planes, layers, num_pages, -1)
        views = tuple(blocks[:, i] for i in range(layers))
    elif direct:
        blocks = raw.reshape(planes, num_pages, layers, -1)
        views = tuple(blocks[:, :, i] for i in range(layers))
    else:
        views = (raw.reshape(planes, num_pages, -1),)
    if order is ChunkOrder.TOKEN_MAJOR:
        # One chunk "layer" spanning every layer: heads of every layer (MLA: latents of every layer side by side).
        chunk_layers, heads, dim = 1, (1 if mla else layers * heads), (layers * dim if mla else dim)
    else:
        chunk_layers = layers
    layout = KVLayout(
        num_layers=chunk_layers,
        num_kv_heads=heads,
        head_dim=dim,
        dtype=dtype,
        chunk_tokens=page,
        page_tokens=page,
        mla=mla,
    )
    return HostPages(layout, order, host_layout, views, page, num_pages)

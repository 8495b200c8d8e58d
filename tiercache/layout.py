"""Byte layout of one KV chunk.

A chunk holds the KV of ``chunk_tokens`` consecutive tokens for every layer, laid out layer-major so that
one layer of a chunk is one contiguous byte range (this is what makes layerwise loading possible):

* standard attention: ``[layer][k|v][token][kv_head][head_dim]``
* MLA (one compressed latent per token): ``[layer][token][latent_dim]`` with ``latent_dim == head_dim``

Primitives:
    KVDtype: the element types a chunk may hold.
    KVLayout: shape of a chunk; ``chunk_bytes``, ``layer_bytes``, ``layer_range(l)`` and ``layer_view``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tiercache.errors import InvalidArgumentError


class KVDtype(enum.Enum):
    """Element type of the KV cache. The value is the canonical name used in digests and on the wire."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FP8_E4M3 = "float8_e4m3fn"
    FP8_E5M2 = "float8_e5m2"
    INT8 = "int8"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The matching ``torch.dtype``."""
        dtype: torch.dtype = getattr(torch, self.value)
        return dtype

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @classmethod
    def from_torch(cls, dtype: torch.dtype) -> KVDtype:
        """Map a ``torch.dtype`` to a KVDtype.

        Raises:
            InvalidArgumentError: the dtype is not a supported KV element type.
        """
        for member in cls:
            if member.torch_dtype == dtype:
                return member
        raise InvalidArgumentError("dtype", f"unsupported KV dtype {dtype}; valid: {[m.value for m in cls]}")


_ITEMSIZE = {member: int(torch.empty((), dtype=member.torch_dtype).element_size()) for member in KVDtype}
"""Bytes per element of each dtype (layouts ask on every layer view: keep it a lookup)."""


def _positive(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgumentError(field, f"must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of the KV cache of one chunk.

    Attributes:
        num_layers: attention layers whose KV the chunk holds (this pipeline stage's layers).
        num_kv_heads: KV heads held by this rank (1 for MLA).
        head_dim: size of one head (the latent size for MLA).
        dtype: element type.
        chunk_tokens: tokens per chunk; a positive multiple of ``page_tokens``.
        page_tokens: the engine's KV page (block) size in tokens.
        mla: True for multi-head latent attention: one latent vector per token, no separate K and V.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: KVDtype
    chunk_tokens: int = 256
    page_tokens: int = 16
    mla: bool = False

    def __post_init__(self) -> None:
        _positive("num_layers", self.num_layers)
        _positive("num_kv_heads", self.num_kv_heads)
        _positive("head_dim", self.head_dim)
        _positive("chunk_tokens", self.chunk_tokens)
        _positive("page_tokens", self.page_tokens)
        if not isinstance(self.dtype, KVDtype):
            raise InvalidArgumentError("dtype", f"must be a KVDtype, got {self.dtype!r}")
        if self.chunk_tokens % self.page_tokens:
            raise InvalidArgumentError(
                "chunk_tokens",
                f"{self.chunk_tokens} is not a positive multiple of page_tokens={self.page_tokens}",
            )
        if self.mla and self.num_kv_heads != 1:
            raise InvalidArgumentError(
                "num_kv_heads", f"MLA layouts hold one latent, got {self.num_kv_heads}"
            )

    @property
    def kv_planes(self) -> int:
        """2 (K and V) for standard attention, 1 for MLA."""
        return 1 if self.mla else 2

    @property
    def layer_shape(self) -> tuple[int, ...]:
        """Shape of one layer of one chunk: ``[2, tokens, heads, dim]`` or ``[tokens, dim]`` for MLA."""
        if self.mla:
            return (self.chunk_tokens, self.head_dim)
        return (2, self.chunk_tokens, self.num_kv_heads, self.head_dim)

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer of one chunk."""
        return self.kv_planes * self.chunk_tokens * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one whole chunk (all layers)."""
        return self.num_layers * self.layer_bytes

    def layer_range(self, layer: int) -> tuple[int, int]:
        """Byte range ``(start, stop)`` of ``layer`` inside a chunk buffer.

        Raises:
            InvalidArgumentError: ``layer`` is outside ``[0, num_layers)``.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise InvalidArgumentError("layer", f"{layer!r} not in [0, {self.num_layers})")
        start = layer * self.layer_bytes
        return start, start + self.layer_bytes

    def layer_view(self, chunk: torch.Tensor, layer: int) -> torch.Tensor:
        """A typed view of ``layer`` inside a chunk buffer (no copy).

        Args:
            chunk: 1-D ``uint8`` tensor of ``chunk_bytes`` bytes.
            layer: layer index.

        Returns:
            A tensor of ``layer_shape`` and ``dtype`` sharing memory with ``chunk``.

        Raises:
            InvalidArgumentError: the buffer has the wrong dtype, rank or size.
        """
        self.check_buffer(chunk)
        start, stop = self.layer_range(layer)
        return chunk[start:stop].view(self.dtype.torch_dtype).view(self.layer_shape)

    def chunk_view(self, chunk: torch.Tensor) -> torch.Tensor:
        """A typed view ``[layers, *layer_shape]`` of a whole chunk buffer (no copy)."""
        self.check_buffer(chunk)
        return chunk.view(self.dtype.torch_dtype).view((self.num_layers, *self.layer_shape))

    def check_buffer(self, chunk: torch.Tensor, field: str = "payload") -> None:
        """Check that ``chunk`` is a 1-D uint8 tensor of exactly ``chunk_bytes`` bytes.

        Raises:
            InvalidArgumentError: naming ``field``, when it is not.
        """
        if chunk.dtype != torch.uint8 or chunk.dim() != 1:
            raise InvalidArgumentError(
                field, f"must be a 1-D uint8 tensor, got {chunk.dtype} of rank {chunk.dim()}"
            )
        if chunk.numel() != self.chunk_bytes:
            raise InvalidArgumentError(
                field, f"has {chunk.numel()} bytes, the layout needs {self.chunk_bytes}"
            )

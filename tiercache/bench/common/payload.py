"""Benchmark payloads: random bf16 KV-like bytes, cut into equal chunks, and destination buffers.

KV caches are bf16 activations: random normal values rounded to bf16 have the byte statistics of real KV
(nearly incompressible mantissas, clustered exponents), unlike zeros or ``urandom`` bytes.

Primitives:
    Payload: ``num_chunks`` chunks of ``chunk_bytes`` in one ``[num_chunks, chunk_bytes]`` uint8 tensor.
    make_payload: a seeded random payload on a device, generated once per chunk size.
    make_destinations: a zeroed buffer of the same shape on a device (read-back target).
    batch_ranges: the chunk index ranges of consecutive batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Payload:
    """Equal-size chunks held in one tensor.

    Attributes:
        data: ``[num_chunks, chunk_bytes]`` uint8 tensor; row ``i`` is chunk ``i``.
    """

    data: torch.Tensor

    @property
    def num_chunks(self) -> int:
        """Number of chunks."""
        return int(self.data.shape[0])

    @property
    def chunk_bytes(self) -> int:
        """Bytes per chunk."""
        return int(self.data.shape[1])

    @property
    def total_bytes(self) -> int:
        """Bytes of all chunks."""
        return self.num_chunks * self.chunk_bytes

    @property
    def device(self) -> torch.device:
        """Device the payload lives on."""
        return self.data.device

    def chunks(self) -> list[torch.Tensor]:
        """The chunks as 1-D uint8 views, in order."""
        return list(self.data.unbind(0))

    def to(self, device: torch.device) -> Payload:
        """The same bytes on ``device`` (this payload itself when it is already there)."""
        return self if self.data.device == device else Payload(self.data.to(device))


def make_payload(chunk_bytes: int, num_chunks: int, seed: int = 0) -> Payload:
    """Random bf16 values viewed as bytes, on the CPU (move it with :meth:`Payload.to`).

    Args:
        chunk_bytes: bytes per chunk; positive.
        num_chunks: number of chunks; positive.
        seed: seed of the generator (the same seed and sizes give the same bytes).

    Raises:
        ValueError: a size is not positive.
    """
    if chunk_bytes <= 0 or num_chunks <= 0:
        raise ValueError(f"chunk_bytes ({chunk_bytes}) and num_chunks ({num_chunks}) must be positive")
    gen = torch.Generator().manual_seed(seed)
    data = torch.empty((num_chunks, chunk_bytes), dtype=torch.uint8)
    values = (chunk_bytes + 1) // 2
    for row in data.unbind(0):
        kv = torch.randn(values, generator=gen).to(torch.bfloat16).view(torch.uint8)
        row.copy_(kv[:chunk_bytes])
    return Payload(data)


def make_destinations(payload: Payload, device: torch.device) -> torch.Tensor:
    """A zeroed (hence already faulted-in) ``[num_chunks, chunk_bytes]`` uint8 tensor on ``device``."""
    return torch.zeros((payload.num_chunks, payload.chunk_bytes), dtype=torch.uint8, device=device)


def batch_ranges(count: int, batch: int) -> list[range]:
    """Index ranges of consecutive batches of at most ``batch`` items covering ``range(count)``.

    Raises:
        ValueError: ``batch`` is not positive.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    return [range(start, min(start + batch, count)) for start in range(0, count, batch)]

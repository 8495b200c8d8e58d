"""A pool of CPU staging buffers, reused across stores instead of freshly allocated.

A fresh large allocation is page-faulted on first touch at about 1 GB/s, slower than the copy into it;
a tier that stages every chunk before writing it (the L3 tier stages header + payload) keeps the buffers
of finished reservations for the next ones, up to a byte budget.

Every buffer is placed so that its byte ``payload_offset`` (where a tier copies the chunk, after its header)
starts on a 64-byte boundary: torch's CPU ``copy_`` into a destination that is not 64-byte aligned runs at
about half speed (measured here: 32 us against 14 us for 256 KiB at offset 40 and 64), which cost the shared
tier's put a third of its throughput.

Primitives:
    ALIGN_BYTES: the alignment of each buffer's payload.
    StagingPool: ``take(nbytes)`` a 1-D ``uint8`` CPU tensor, ``give(buffer)`` it back.
"""

from __future__ import annotations

import threading

import torch

ALIGN_BYTES = 64
"""Alignment of the byte at ``payload_offset`` of every staging buffer (a cache line)."""


class StagingPool:
    """Reusable staging buffers, bucketed by exact size, holding at most ``budget_bytes`` while idle.

    Thread-safe: ``take`` and ``give`` may be called from any thread.
    """

    def __init__(self, budget_bytes: int, payload_offset: int = 0) -> None:
        """Args:
        budget_bytes: most bytes of idle buffers kept for reuse (the rest is freed).
        payload_offset: the byte of each buffer that is :data:`ALIGN_BYTES`-aligned (a tier's header size).
        """
        if payload_offset < 0:
            raise ValueError(f"payload_offset must be >= 0, got {payload_offset}")
        self._budget = budget_bytes
        self._payload_offset = payload_offset
        self._held = 0
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A 1-D ``uint8`` CPU tensor of ``nbytes`` bytes (a kept one if any; contents undefined)."""
        with self._lock:
            bucket = self._free.get(nbytes)
            if bucket:
                self._held -= nbytes
                return bucket.pop()
        return self._allocate(nbytes)

    def _allocate(self, nbytes: int) -> torch.Tensor:
        """A fresh buffer of ``nbytes`` whose byte ``payload_offset`` is aligned (a view into a slightly
        larger allocation, which the view keeps alive)."""
        backing = torch.empty(nbytes + ALIGN_BYTES, dtype=torch.uint8)
        start = -(backing.data_ptr() + self._payload_offset) % ALIGN_BYTES
        return backing[start : start + nbytes]

    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take`; it is kept if the budget allows, else freed."""
        nbytes = buffer.numel()
        with self._lock:
            if self._held + nbytes <= self._budget:
                self._free.setdefault(nbytes, []).append(buffer)
                self._held += nbytes

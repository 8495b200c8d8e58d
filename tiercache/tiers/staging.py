"""A pool of CPU staging buffers, reused across stores instead of freshly allocated.

A fresh large allocation is page-faulted on first touch at about 1 GB/s, slower than the copy into it;
a tier that stages every chunk before writing it (the L3 tier stages header + payload) keeps the buffers
of finished reservations for the next ones, up to a byte budget.

Primitives:
    StagingPool: ``take(nbytes)`` a 1-D ``uint8`` CPU tensor, ``give(buffer)`` it back.
"""

from __future__ import annotations

import threading

import torch


class StagingPool:
    """Reusable staging buffers, bucketed by exact size, holding at most ``budget_bytes`` while idle.

    Thread-safe: ``take`` and ``give`` may be called from any thread.
    """

    def __init__(self, budget_bytes: int) -> None:
        """Args: budget_bytes: most bytes of idle buffers kept for reuse (the rest is freed)."""
        self._budget = budget_bytes
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
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buffer: torch.Tensor) -> None:
        """Return a buffer from :meth:`take`; it is kept if the budget allows, else freed."""
        nbytes = buffer.numel()
        with self._lock:
            if self._held + nbytes <= self._budget:
                self._free.setdefault(nbytes, []).append(buffer)
                self._held += nbytes

"""Checked copies into and out of one run of a page pool: the bytes and their checksum in one pass.

A CPU pool's run is copied through numpy views of the pool (:func:`~tiercache.checksum.copy_checksum_array`:
each block hashed while it is in cache, no tensor op per chunk); a strided source or destination goes through
torch (:func:`~tiercache.checksum.copy_checksum_tensor`); a GPU pool copies, then hashes the run in place.
The pool (:mod:`tiercache.tiers.slots`) holds its lock around neither.

A batch of large chunks is copied on several threads where the host has cores to spare
(:class:`CopyPool`): each chunk's copy and hash release the interpreter lock, and one thread reaches only
part of a large host's memory bandwidth (the H200 host's 16 cores: L2 put and get ran at 0.14-0.22x of a
16-thread memcpy, one chunk at a time). A chunk's checksum is one streaming hash, so a chunk stays on one
thread. Hosts of fewer than 4 cores copy on the caller's thread alone: there a second thread takes the
engine's core.

Primitives:
    copy_in: copy a source into a run and give the run's checksum.
    copy_out: copy a run to a destination and check it against the commit-time checksum.
    copy_workers: the helper threads a tier's copies may use on a host of so many cores.
    CopyPool: runs a batch's copies on the caller's thread and those helpers.
    PARALLEL_MIN_BYTES: the smallest batch whose copies are shared with the helpers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar, cast

import numpy as np
import torch

from tiercache.checksum import copy_checksum_array, copy_checksum_tensor
from tiercache.tiers.pages import checksum_of


def copy_in(
    host_row: Callable[[], np.ndarray] | None,
    row: Callable[[], torch.Tensor],
    src: torch.Tensor,
    known: int | None,
) -> int:
    """Copy ``src`` into a run and give its checksum: ``known`` as it is (the source is only copied), else
    hashed as the bytes land.

    Args:
        host_row: the run as a numpy view (None for a GPU pool).
        row: the run as a tensor of the chunk's bytes.
        src: the chunk's bytes.
        known: a checksum the caller already holds.
    """
    if known is None and host_row is not None and src.device.type == "cpu" and src.is_contiguous():
        return copy_checksum_array(host_row(), src.numpy())
    dst = row()
    if known is None and src.device.type == "cpu":
        return copy_checksum_tensor(dst, src)
    dst.copy_(src)
    return known if known is not None else checksum_of(dst)


def copy_out(
    host_row: Callable[[], np.ndarray] | None,
    row: Callable[[], torch.Tensor],
    dst: torch.Tensor,
    nbytes: int,
    checksum: int | None,
) -> bool:
    """Copy a run's ``nbytes`` into ``dst``; False when the bytes that left do not match ``checksum`` (None:
    unchecked, always True).

    Args:
        host_row: the run as a numpy view (None for a GPU pool).
        row: the run as a tensor of the chunk's bytes.
        dst: the destination (at least ``nbytes``).
        nbytes: the chunk's bytes.
        checksum: its commit-time checksum.
    """
    if checksum is not None and host_row is not None and dst.device.type == "cpu" and dst.is_contiguous():
        return copy_checksum_array(dst.numpy(), host_row()) == checksum
    out, src = dst[:nbytes], row()
    if checksum is None:
        out.copy_(src)
        return True
    if out.device.type == "cpu":
        return copy_checksum_tensor(out, src) == checksum
    out.copy_(src)
    return checksum_of(src) == checksum


_T = TypeVar("_T")

PARALLEL_MIN_BYTES = 16 << 20
"""The smallest batch (bytes) whose copies are shared with a :class:`CopyPool`'s helpers."""


def copy_workers(cpus: int | None = None) -> int:
    """The helper threads a tier's copies may use beside the caller's on a host of ``cpus`` cores (None: this
    one's): none under 4 cores, else half the cores less the caller's, at most 7."""
    n = (os.cpu_count() or 1) if cpus is None else cpus
    return 0 if n < 4 else min(n // 2 - 1, 7)


class CopyPool:
    """Runs the copies of a batch on the caller's thread and up to ``workers`` helper threads."""

    def __init__(self, workers: int, name: str) -> None:
        """Args: workers: helper threads (0: every copy on the caller's thread); name: their name prefix."""
        self._workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name) if workers > 0 else None

    def run(self, calls: Sequence[Callable[[], _T]], nbytes: int) -> list[_T]:
        """Each call's result, in order. A batch of ``nbytes`` under :data:`PARALLEL_MIN_BYTES`, or of one
        call, runs on the caller's thread; otherwise the caller and the helpers each take the next call nobody
        took (as the connector's split store does), so a helper that is slow to start leaves its share to the
        others. Returns only once every call has finished (a copy never outlives its caller's hold on the
        slots), raising the first error."""
        if self._executor is None or len(calls) < 2 or nbytes < PARALLEL_MIN_BYTES:
            return [call() for call in calls]
        results: list[_T | None] = [None] * len(calls)
        pending = iter(range(len(calls)))
        take = threading.Lock()

        def drain() -> None:
            while True:
                with take:
                    i = next(pending, None)
                if i is None:
                    return
                results[i] = calls[i]()

        helpers = [self._executor.submit(drain) for _ in range(min(self._workers, len(calls) - 1))]
        try:
            drain()
        finally:
            wait(helpers)
        for helper in helpers:
            helper.result()  # the first error of a helper
        return cast(list[_T], results)  # every call ran: no None left

    def close(self) -> None:
        """Stop the helpers (idempotent)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)

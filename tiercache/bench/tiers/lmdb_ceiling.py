"""L3's own ceiling in ``tiercache-bench tiers``: raw py-lmdb get-and-copy of the same bytes, page-cached.

A memcpy is out of L3's reach: its values are read through LMDB's 4 KiB-paged memory map (about 12 GB/s
here against 20-37 GB/s for a memcpy between anonymous buffers). What L3 can reach is what py-lmdb alone
does with the same bytes: the chunks written once into a fresh environment opened like L3's (no readahead,
no sync), then, per batch, one read transaction whose ``get`` of each key (a zero-copy buffer) is copied
into the caller's destination with ``np.copyto``. L3's hot get does those steps plus its own (value header,
checksum, chain-depth record, bookkeeping), so the ratio is what L3's own work costs.

Primitives:
    LMDB_DEVICE: the ``device`` of the ceiling (its label is ``lmdb_get(lmdb)``).
    measure_lmdb_get: the raw get-and-copy ceiling of a payload's chunks.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import lmdb
import numpy as np
import torch

from ..ceilings import CeilingKind, CeilingResult
from ..common.payload import batch_ranges
from ..common.timing import time_calls

LMDB_DEVICE = "lmdb"
"""Device name of the raw LMDB ceiling."""

_MAP_SLACK_BYTES = 64 << 20


def _get_batch(env: lmdb.Environment, keys: Sequence[bytes], dsts: Sequence[np.ndarray]) -> None:
    with env.begin(buffers=True) as txn:
        for key, dst in zip(keys, dsts, strict=True):
            value = txn.get(key)
            if value is None:
                raise RuntimeError("lmdb ceiling: a key written in this round was not found")
            np.copyto(dst, np.frombuffer(value, dtype=np.uint8))


def measure_lmdb_get(
    srcs: Sequence[torch.Tensor],
    dsts: Sequence[torch.Tensor],
    directory: Path,
    batch: int,
    warmup_rounds: int,
) -> CeilingResult:
    """Write every chunk into a fresh LMDB environment, then time get-and-copy of all, ``batch`` per call.

    Args:
        srcs: the payload chunks (1-D uint8 CPU tensors, equal sizes).
        dsts: preallocated CPU destinations of the same sizes.
        directory: where the environment is created (L3's filesystem); removed afterwards.
        batch: chunks per read transaction (one timed call).
        warmup_rounds: untimed get rounds first (the values are in the page cache from the write).

    Returns:
        The ``lmdb_get`` ceiling.
    """
    chunk_bytes = int(srcs[0].numel())
    total = sum(int(s.numel()) for s in srcs)
    keys = [f"lmdb-ceiling:{chunk_bytes}:{i}".encode() for i in range(len(srcs))]
    dst_np = [d.numpy() for d in dsts]
    path = directory / f"lmdb-ceiling-{chunk_bytes}"
    env = lmdb.open(
        str(path),
        map_size=2 * total + _MAP_SLACK_BYTES,
        sync=False,
        metasync=False,
        readahead=False,
        meminit=False,
    )
    try:
        with env.begin(write=True) as txn:
            for key, src in zip(keys, srcs, strict=True):
                txn.put(key, src.numpy().data)
        ranges = batch_ranges(len(srcs), batch)
        calls = [partial(_get_batch, env, keys[r.start : r.stop], dst_np[r.start : r.stop]) for r in ranges]
        for _ in range(warmup_rounds):
            for call in calls:
                call()
        timing = time_calls(calls, total, torch.device("cpu"))
    finally:
        env.close()
        shutil.rmtree(path, ignore_errors=True)
    return CeilingResult(
        CeilingKind.LMDB_GET, LMDB_DEVICE, chunk_bytes, timing, "raw py-lmdb get + np.copyto, page-cached"
    )

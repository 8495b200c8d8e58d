"""The shared tier's ceiling in ``tiercache-bench tiers``: raw redis-py SET / GET of the same bytes on the
same store (cluster or server), in the same run, batched like the tier (one pipeline per batch).

The ceiling is what the client library alone moves, at its best (hiredis parses the replies; commands are
packed with the tier's own connection class, which sends a large value to the socket as it is): a SET pipeline of the payload chunks (memoryviews, no
copy on our side) and a GET pipeline that returns them as ``bytes`` (not copied on into a destination, not
checked). The tier's put/get do the same round trips plus its value format (a 40-byte header, xxh3
checksums, a copy into the caller's buffer), so the ratio is what the tier's own work costs.

Primitives:
    REDIS_DEVICE: the ``device`` of these ceilings (their label is ``redis_set(redis)`` / ``redis_get(redis)``).
    open_client: a redis-py client of the store a seed URL points at (cluster detected).
    measure_redis: the SET and GET ceilings of a payload's chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import redis
import torch
from redis.cluster import RedisCluster

from tiercache.tiers.shared_client import fast_connection_class

from ..ceilings import CeilingKind, CeilingResult
from ..common.payload import batch_ranges
from ..common.timing import time_calls

REDIS_DEVICE = "redis"
"""Device name of the SET / GET ceilings."""


def open_client(url: str) -> redis.Redis | RedisCluster:
    """A client of the store at the first seed of ``url``: a cluster client when it is a cluster node."""
    seed = url.split(",")[0].strip()
    probe = redis.Redis.from_url(seed)
    try:
        cluster = int(probe.info("cluster").get("cluster_enabled", 0)) == 1
    finally:
        probe.close()
    packing = fast_connection_class(seed)  # the client library at its best: large values sent as they are
    kwargs = {} if packing is None else {"connection_class": packing}
    return RedisCluster.from_url(seed, **kwargs) if cluster else redis.Redis.from_url(seed, **kwargs)


def _set(client: Any, keys: Sequence[bytes], values: Sequence[memoryview]) -> None:
    pipe = client.pipeline(transaction=False)
    for key, value in zip(keys, values, strict=True):
        pipe.set(key, value)
    pipe.execute()


def _get(client: Any, keys: Sequence[bytes]) -> None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    replies = pipe.execute()
    if any(r is None for r in replies):
        raise RuntimeError("redis ceiling: a key set in this round was not found")


def _delete(client: Any, keys: Sequence[bytes], ranges: Sequence[range]) -> None:
    """Delete ``keys``, one pipeline per batch."""
    for r in ranges:
        pipe = client.pipeline(transaction=False)
        for key in keys[r.start : r.stop]:
            pipe.delete(key)
        pipe.execute()


def measure_redis(
    url: str, srcs: Sequence[torch.Tensor], batch: int, warmup_rounds: int
) -> list[CeilingResult]:
    """Time raw SET then GET of every chunk, ``batch`` chunks per pipeline; the keys are deleted after.

    Each warm-up round ends by deleting its keys, as the tier's warm-up does, so the timed SETs make new
    keys just as the tier's timed puts do (overwriting a key lets Redis reuse the old value's memory, which
    a put of a new chunk never gets: measured 1.1 against 0.8 GB/s at 1 MiB here).

    Args:
        url: the store's seed URL (the one the shared tier is measured on).
        srcs: the payload chunks (1-D uint8 CPU tensors).
        batch: chunks per pipeline.
        warmup_rounds: untimed SET/GET rounds first.

    Returns:
        The ``redis_set`` and ``redis_get`` ceilings.
    """
    chunk_bytes = int(srcs[0].numel())
    keys = [
        hashlib.blake2b(f"ceiling:{chunk_bytes}:{i}".encode(), digest_size=24).digest()
        for i in range(len(srcs))
    ]
    values = [s.numpy().data for s in srcs]
    total = sum(s.numel() for s in srcs)
    ranges = batch_ranges(len(srcs), batch)
    client = open_client(url)
    try:
        sets = [partial(_set, client, keys[r.start : r.stop], values[r.start : r.stop]) for r in ranges]
        gets = [partial(_get, client, keys[r.start : r.stop]) for r in ranges]
        for _ in range(warmup_rounds):
            for call in (*sets, *gets):
                call()
            _delete(client, keys, ranges)  # as the tier's warm-up does: timed SETs make new keys
        cpu = torch.device("cpu")
        put = time_calls(sets, total, cpu)
        get = time_calls(gets, total, cpu)
        _delete(client, keys, ranges)
    finally:
        client.close()
    note = "redis-py pipelines, one per batch"
    return [
        CeilingResult(CeilingKind.REDIS_SET, REDIS_DEVICE, chunk_bytes, put, note),
        CeilingResult(CeilingKind.REDIS_GET, REDIS_DEVICE, chunk_bytes, get, note),
    ]

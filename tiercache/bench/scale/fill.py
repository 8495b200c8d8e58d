"""A bulk fill of an L3 directory for the ``scale`` benchmark: a million chunks in seconds, not minutes.

Storing a million chunks through the cache one prompt at a time takes the best part of ten minutes on a
small machine; what the benchmark measures at that size is the index a warm start builds over them, not
the store path. This module writes the chunks of whole prompts straight into a fresh L3 environment in
large transactions, with exactly what the tier itself writes for each chunk (the value format of
:mod:`tiercache.tiers.values`, its access sequence number, its per-chunk record with the chain depth), by
the tier's own write function (:func:`tiercache.tiers.lmdb_io.write_values`). The cache opened on the
directory afterwards runs the real warm-start code path.

Primitives:
    BULK_TXN_CHUNKS: chunks written per LMDB transaction.
    bulk_fill_l3: write prompts' chunks into a fresh L3 directory; returns the chunk ids by prompt.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

from tiercache.keys import chunk_id
from tiercache.tiers.lmdb_config import LmdbTierConfig
from tiercache.tiers.lmdb_env import open_environment
from tiercache.tiers.lmdb_io import StoredValue, write_values
from tiercache.tiers.values import encode

logger = logging.getLogger(__name__)

BULK_TXN_CHUNKS = 65_536
"""Chunks written per LMDB transaction (a few tens of MiB of tiny chunks)."""


def bulk_fill_l3(
    config: LmdbTierConfig,
    namespace_id: bytes,
    prompts: Iterator[list[bytes]],
    count: int,
    chunk_bytes: int,
    advance: Callable[[int], None] | None = None,
) -> list[list[bytes]]:
    """Write ``count // len(prompt)`` prompts' chunks (raw payloads of ``chunk_bytes``) into ``config.path``.

    Each chunk's payload is ``chunk_bytes`` bytes of its key length (what the cache fill of the benchmark
    stores), its depth its position in its prompt, its sequence number its position in the fill (the last
    prompt is the most recently used). ``advance`` is told of every prompt written (progress).

    Returns:
        The keys of each prompt written, in order.
    """
    os.makedirs(config.path, exist_ok=True)
    opened = open_environment(
        config.path,
        map_size_bytes=config.effective_map_size_bytes,
        durable=False,
        preallocate_bytes=config.preallocate_bytes,
    )
    stored: list[list[bytes]] = []
    batch: list[StoredValue] = []
    seq = opened.found.last_seq + 1
    try:
        while True:
            keys = next(prompts)
            if (len(stored) + 1) * len(keys) > count:
                break
            for depth, key in enumerate(keys):
                header, payload = encode(bytes([len(key) & 0xFF]) * chunk_bytes, None)
                batch.append(StoredValue(chunk_id(namespace_id, key), header + bytes(payload), depth))
            stored.append(keys)
            if advance is not None:
                advance(len(keys))
            if len(batch) >= BULK_TXN_CHUNKS:
                write_values(opened.env, opened.dbs, batch, seq, {})
                seq += len(batch)
                batch = []
        if batch:
            write_values(opened.env, opened.dbs, batch, seq, {})
        opened.env.sync(True)
    finally:
        opened.env.close()
    logger.info("bulk-filled %s with %d prompts", config.path, len(stored))
    return stored

"""Chunk stores the ``compare`` benchmark puts next to tiercache: Redis, plain files, and tiercache itself.

Every store moves the same thing: the full chunks of a prompt's KV, taken from and put back into the
engine's per-layer tensors (:class:`~tiercache.connector.ContiguousKV`), keyed by the prompt's chunk keys.
Redis and files serialize each chunk into one staging buffer (layer-major, as tiercache lays chunks out)
and send it; tiercache copies straight between the tensors and its shared-memory slots. ``clear`` removes
what a store stored, so that the benchmark's next round stores afresh (a store of chunks that are already
there would time nothing); ``close`` clears too, so that a given Redis or daemon is left as it was found.

Primitives:
    ChunkStore: the protocol (``name``, ``store``, ``load``, ``clear``, ``close``).
    FileStore: one file per chunk in a directory (written to a temporary name, renamed; optional fsync).
    RedisStore: one key per chunk, a prompt's chunks in one pipeline.
    TierCacheStore: :class:`~tiercache.connector.KVConnector` (shared memory or, forced, the byte stream).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from tiercache.connector import (
    ConnectorConfig,
    ContiguousKV,
    DataPlaneMode,
    KVConnector,
    TierCacheClient,
    chunk_to_kv,
    kv_to_chunk,
)
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout

_DEL_BATCH = 512
"""Keys per Redis DEL when a store is cleared."""


class ChunkStore(Protocol):
    """Where a prompt's KV chunks can be stored and loaded back."""

    name: str

    def store(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """Store the full chunks of ``tokens`` from ``kv``; returns chunks stored."""
        ...

    def load(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """Load the stored prefix of ``tokens`` into ``kv``; returns chunks loaded."""
        ...

    def clear(self) -> None:
        """Remove every chunk this store stored; it can store them again."""
        ...

    def close(self) -> None:
        """Remove every chunk this store stored and release what it holds."""
        ...


class _Staged:
    def __init__(self, namespace: Namespace) -> None:
        self._ns = namespace
        self._layout: KVLayout = namespace.layout
        self._staging = torch.empty(self._layout.chunk_bytes, dtype=torch.uint8)

    def _keys(self, tokens: np.ndarray) -> list[bytes]:
        return chunk_keys(self._ns, tokens)


class FileStore(_Staged):
    """One file per chunk, named by its key, in ``directory``."""

    def __init__(self, namespace: Namespace, directory: Path, fsync: bool) -> None:
        """Use ``directory`` (created); ``fsync`` each file (and the directory) before it counts as stored."""
        super().__init__(namespace)
        self.name = f"files (fsync={'on' if fsync else 'off'})"
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync

    def store(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """Write each chunk to ``<key>.tmp`` then rename it to ``<key>``."""
        keys = self._keys(tokens)
        view = self._staging.numpy()
        for i, key in enumerate(keys):
            kv_to_chunk(self._layout, kv, i, self._staging)
            tmp = self._dir / f"{key.hex()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                data = view.data
                while data:
                    data = data[os.write(fd, data) :]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._dir / key.hex())
        if self._fsync and keys:
            dfd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return len(keys)

    def load(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """Read each chunk's file (until the first missing one) into the tensors."""
        view = self._staging.numpy().data
        loaded = 0
        for i, key in enumerate(self._keys(tokens)):
            try:
                fd = os.open(self._dir / key.hex(), os.O_RDONLY)
            except FileNotFoundError:
                break
            try:
                got = 0
                while got < len(view):
                    n = os.readv(fd, [view[got:]])
                    if n == 0:
                        raise OSError(f"{key.hex()}: short chunk file ({got} bytes)")
                    got += n
            finally:
                os.close(fd)
            chunk_to_kv(self._layout, self._staging, kv, i)
            loaded += 1
        return loaded

    def clear(self) -> None:
        """Remove every chunk file (the directory is made again, empty)."""
        self.close()
        self._dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Remove the directory and its chunk files."""
        shutil.rmtree(self._dir, ignore_errors=True)


class RedisStore(_Staged):
    """One Redis key per chunk; a prompt's chunks go in one pipeline (one round trip)."""

    def __init__(self, namespace: Namespace, client: Any) -> None:
        """Use ``client`` (a ``redis.Redis``)."""
        super().__init__(namespace)
        self.name = "redis"
        self._client = client
        self._stored: list[bytes] = []

    def store(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """SET every chunk in one pipeline."""
        keys = self._keys(tokens)
        pipe = self._client.pipeline(transaction=False)
        for i, key in enumerate(keys):
            kv_to_chunk(self._layout, kv, i, self._staging)
            pipe.set(key, self._staging.numpy().tobytes())
        pipe.execute()
        self._stored += keys
        return len(keys)

    def load(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """GET every chunk in one pipeline; copy the found prefix into the tensors."""
        keys = self._keys(tokens)
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        values: Sequence[bytes | None] = pipe.execute()
        loaded = 0
        for i, value in enumerate(values):
            if value is None or len(value) != self._layout.chunk_bytes:
                break
            chunk_to_kv(self._layout, torch.frombuffer(bytearray(value), dtype=torch.uint8), kv, i)
            loaded += 1
        return loaded

    def clear(self) -> None:
        """DEL every key this store SET."""
        for i in range(0, len(self._stored), _DEL_BATCH):
            self._client.delete(*self._stored[i : i + _DEL_BATCH])
        self._stored.clear()

    def close(self) -> None:
        """:meth:`clear` (a given Redis keeps nothing of the run; the client is closed by its owner)."""
        self.clear()


class TierCacheStore:
    """tiercache through the connector."""

    def __init__(self, namespace: Namespace, client: TierCacheClient, force_remote: bool = False) -> None:
        """Use ``client``; ``force_remote`` takes the byte stream instead of shared memory."""
        self.name = "tiercache (byte stream)" if force_remote else "tiercache (shared memory)"
        self._c = namespace.layout.chunk_tokens
        self._client = client
        self._ns = namespace
        self._conn = KVConnector(
            client, namespace, ConnectorConfig(DataPlaneMode.STREAM if force_remote else DataPlaneMode.AUTO)
        )

    def store(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """``KVConnector.store``; chunks stored (already cached ones count as stored)."""
        r = self._conn.store(tokens, kv)
        return int(r.tokens_stored + r.tokens_skipped) // self._c

    def load(self, tokens: np.ndarray, kv: ContiguousKV) -> int:
        """``KVConnector.load``; chunks loaded."""
        return int(self._conn.load(tokens, kv).tokens_loaded) // self._c

    def clear(self) -> None:
        """Purge the namespace from every tier."""
        self._client.purge(self._ns)

    def close(self) -> None:
        """:meth:`clear` (the client is closed by its owner)."""
        self.clear()

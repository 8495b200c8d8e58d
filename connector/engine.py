"""Engine-facing helpers: load a prompt's cached prefix into the engine's KV tensors, store what it computed.

:class:`KVConnector` binds a client to one namespace. Its calls never raise on daemon trouble (down, slow,
restarting, out of space, bad state): they log a warning and report 0 tokens loaded / stored, so that the
engine recomputes. They do raise on the engine's own mistakes (KV tensors that do not match the layout) and
let exceptions of the engine-side copy propagate — after releasing the lease or aborting the store.

The data plane is chosen per call: the daemon's shared-memory slots when its segment can be mapped in this
process (one copy per chunk and layer, straight between slot and engine tensor), else the byte stream.
``ConnectorConfig.force_remote`` always uses the byte stream.

A load's bytes count as loaded only if the lease provably covered the copy: the daemon confirmed the
release, or the copy finished before the lease's expiry by the local clock. Otherwise the slots may have
been reused and the load reports 0 tokens.

Primitives:
    ConnectorConfig: data-plane choice, codec, lease and ticket TTLs.
    KVConnector: lookup, prefetch, load, store.
    LoadResult, StoreResult: token-weighted outcomes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tiercache.errors import InvalidArgumentError, TierCacheError, UnavailableError
from tiercache.keys import Namespace, chunk_keys

from .client import TierCacheClient
from .dataplane import SlotMapping
from .kv import EngineKV, check_kv, chunk_to_kv, kv_to_chunk
from .results import LoadLease, SlotRef, StoreTicket
from .stream import Codec

logger = logging.getLogger(__name__)

Tokens = Sequence[int] | np.ndarray


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    """How a connector moves bytes.

    Attributes:
        force_remote: always use the byte stream, even when the shared-memory segment is reachable.
        codec: codec of the byte stream (RAW or ZSTD).
        load_ttl_s: lifetime of a load lease (0: the daemon's default).
        store_ttl_s: lifetime of a store ticket (0: the daemon's default).
    """

    force_remote: bool = False
    codec: Codec = Codec.RAW
    load_ttl_s: float = 0.0
    store_ttl_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise InvalidArgumentError("codec", f"must be a Codec, got {self.codec!r}")
        for name in ("load_ttl_s", "store_ttl_s"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(name, f"must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Outcome of a load, in tokens.

    Attributes:
        tokens_looked_up: tokens in the full chunks of the prompt (what could have been loaded).
        tokens_hit: tokens of the cached prefix the daemon offered.
        tokens_loaded: tokens whose KV arrived intact in the engine's tensors (the engine skips these).
        remote: True when the byte stream was used.
    """

    tokens_looked_up: int
    tokens_hit: int
    tokens_loaded: int
    remote: bool = False


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Outcome of a store, in tokens.

    Attributes:
        tokens_offered: tokens in the full chunks of the prompt.
        tokens_stored: tokens of the chunks the daemon added.
        tokens_skipped: tokens of chunks already cached (or being stored by another engine).
        remote: True when the byte stream was used.
    """

    tokens_offered: int
    tokens_stored: int
    tokens_skipped: int
    remote: bool = False


def _prefix(refs: Sequence[SlotRef]) -> list[SlotRef]:
    """The slots of positions 0, 1, 2, ... in order, up to the first gap."""
    by_index = {r.index: r for r in refs}
    out: list[SlotRef] = []
    while len(out) in by_index:
        out.append(by_index[len(out)])
    return out


class KVConnector:
    """Loads and stores one namespace's KV between the daemon and the engine's tensors.

    Attributes:
        client: the daemon client.
        namespace: the namespace (its layout must match the engine's tensors).
        config: data-plane options.
    """

    def __init__(
        self,
        client: TierCacheClient,
        namespace: Namespace,
        config: ConnectorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.config = config or ConnectorConfig()
        self._layout = namespace.layout
        self._clock = clock

    # ------------------------------------------------------------------ queries

    def lookup(self, tokens: Tokens, prefetch: bool = False) -> int:
        """Tokens of the prompt's cached prefix (0 when the daemon cannot answer)."""
        keys = chunk_keys(self.namespace, tokens)
        if not keys:
            return 0
        try:
            info = self.client.lookup(self.namespace, keys, prefetch=prefetch)
        except TierCacheError as exc:
            logger.warning("tiercache lookup failed (%s); treating as a miss", exc)
            return 0
        return info.chunks * self._layout.chunk_tokens

    def prefetch(self, tokens: Tokens, wait_s: float = 0.0) -> int:
        """Promote the prompt's cached prefix into shared memory; tokens ready (0 on daemon trouble)."""
        keys = chunk_keys(self.namespace, tokens)
        if not keys:
            return 0
        try:
            return self.client.prefetch(self.namespace, keys, wait_s) * self._layout.chunk_tokens
        except TierCacheError as exc:
            logger.warning("tiercache prefetch failed (%s)", exc)
            return 0

    # ------------------------------------------------------------------ load

    def load(self, tokens: Tokens, kv: EngineKV) -> LoadResult:
        """Copy the cached prefix of ``tokens`` into the engine's tensors.

        Args:
            tokens: the prompt's token ids (only full chunks are considered).
            kv: the engine's tensors for this request, large enough for every full chunk of ``tokens``.

        Returns:
            How many tokens were looked up, offered and loaded; the engine recomputes the rest.

        Raises:
            InvalidArgumentError: ``tokens`` or ``kv`` are malformed (engine bugs, not daemon trouble).
            Exception: whatever the engine-side copy raises (the lease is released first).
        """
        keys = chunk_keys(self.namespace, tokens)
        looked_up = len(keys) * self._layout.chunk_tokens
        check_kv(self._layout, kv, len(keys))
        if not keys:
            return LoadResult(0, 0, 0)
        remote = self.config.force_remote
        try:
            remote = remote or self.client.slot_mapping(self.namespace) is None
            if remote:
                return self._load_stream(keys, kv, looked_up)
            return self._load_shm(keys, kv, looked_up)
        except TierCacheError as exc:
            logger.warning("tiercache load failed (%s); recomputing %d tokens", exc, looked_up)
            return LoadResult(looked_up, 0, 0, remote)

    def _current_mapping(self) -> SlotMapping:
        """The segment of the current registration (a call may just have re-registered after a restart)."""
        mapping = self.client.slot_mapping(self.namespace)
        if mapping is None:
            raise UnavailableError("data plane: the daemon's shared memory is no longer reachable")
        return mapping

    def _load_shm(self, keys: list[bytes], kv: EngineKV, looked_up: int) -> LoadResult:
        c_tokens = self._layout.chunk_tokens
        started = self._clock()
        lease = self.client.acquire_load(self.namespace, keys, ttl_s=self.config.load_ttl_s)
        if lease.lease_id == 0:
            return LoadResult(looked_up, 0, 0)
        refs = _prefix(lease.slots)
        copied = 0
        try:
            with self._current_mapping().use() as slots:
                for ref in refs:
                    if ref.nbytes != self._layout.chunk_bytes:
                        logger.warning(
                            "slot of chunk %d holds %d bytes, expected %d",
                            ref.index,
                            ref.nbytes,
                            self._layout.chunk_bytes,
                        )
                        break
                    chunk_to_kv(self._layout, slots.view(ref), kv, ref.index)
                    copied += 1
        finally:
            released = self._release(lease)
        in_time = self._clock() < started + lease.expires_in_s
        if released is False or (released is None and not in_time):
            logger.warning("load lease %d lapsed during the copy; recomputing", lease.lease_id)
            copied = 0
        return LoadResult(looked_up, len(refs) * c_tokens, copied * c_tokens)

    def _release(self, lease: LoadLease) -> bool | None:
        """Release a lease; None when the daemon could not answer (it then expires at its TTL)."""
        try:
            return self.client.release_load(self.namespace, lease.lease_id)
        except TierCacheError as exc:
            logger.warning("releasing load lease %d failed (%s); it expires at its TTL", lease.lease_id, exc)
            return None

    def _load_stream(self, keys: list[bytes], kv: EngineKV, looked_up: int) -> LoadResult:
        chunks = self.client.stream_load(self.namespace, keys, codec=self.config.codec)
        for chunk in chunks:
            chunk_to_kv(self._layout, torch.frombuffer(chunk.data, dtype=torch.uint8), kv, chunk.index)
        hit = len(chunks) * self._layout.chunk_tokens
        return LoadResult(looked_up, hit, hit, remote=True)

    # ------------------------------------------------------------------ store

    def store(self, tokens: Tokens, kv: EngineKV) -> StoreResult:
        """Store the KV of the full chunks of ``tokens`` from the engine's tensors.

        Chunks the daemon already holds are skipped. On daemon trouble nothing is stored (the reservation
        is aborted) and 0 tokens are reported.

        Raises:
            InvalidArgumentError: ``tokens`` or ``kv`` are malformed (engine bugs, not daemon trouble).
            Exception: whatever the engine-side copy raises (the store is aborted first).
        """
        keys = chunk_keys(self.namespace, tokens)
        offered = len(keys) * self._layout.chunk_tokens
        check_kv(self._layout, kv, len(keys))
        if not keys:
            return StoreResult(0, 0, 0)
        remote = self.config.force_remote
        try:
            remote = remote or self.client.slot_mapping(self.namespace) is None
            if remote:
                return self._store_stream(keys, kv, offered)
            return self._store_shm(keys, kv, offered)
        except TierCacheError as exc:
            logger.warning("tiercache store failed (%s); %d tokens not cached", exc, offered)
            return StoreResult(offered, 0, 0, remote)

    def _store_shm(self, keys: list[bytes], kv: EngineKV, offered: int) -> StoreResult:
        c_tokens = self._layout.chunk_tokens
        ticket = self.client.begin_store(self.namespace, keys, ttl_s=self.config.store_ttl_s)
        committed = False
        try:
            with self._current_mapping().use() as slots:
                for ref in ticket.slots:
                    if ref.nbytes != self._layout.chunk_bytes or not 0 <= ref.index < len(keys):
                        raise TierCacheError(
                            f"store slot for chunk {ref.index} holds {ref.nbytes} bytes,"
                            f" expected {self._layout.chunk_bytes}"
                        )
                    kv_to_chunk(self._layout, kv, ref.index, slots.view(ref))
            stored = self.client.commit_store(self.namespace, ticket.ticket_id)
            committed = True
        finally:
            if not committed:
                self._abort(ticket)
        return StoreResult(offered, stored * c_tokens, len(ticket.skipped) * c_tokens)

    def _abort(self, ticket: StoreTicket) -> None:
        try:
            self.client.abort_store(self.namespace, ticket.ticket_id)
        except TierCacheError as exc:
            logger.warning(
                "aborting store ticket %d failed (%s); it expires at its TTL", ticket.ticket_id, exc
            )

    def _store_stream(self, keys: list[bytes], kv: EngineKV, offered: int) -> StoreResult:
        c_tokens = self._layout.chunk_tokens
        cached = self.client.lookup(self.namespace, keys).chunks
        if cached >= len(keys):
            return StoreResult(offered, 0, offered, remote=True)
        staging = torch.empty(self._layout.chunk_bytes, dtype=torch.uint8)

        def payloads() -> Iterator[torch.Tensor]:
            # One staging buffer: each chunk is cut into (copied) messages before the next is staged.
            for index in range(cached, len(keys)):
                kv_to_chunk(self._layout, kv, index, staging)
                yield staging

        result = self.client.stream_store(
            self.namespace, keys[cached:], payloads(), start_depth=cached, codec=self.config.codec
        )
        skipped = cached + len(result.skipped)
        return StoreResult(offered, result.stored * c_tokens, skipped * c_tokens, remote=True)

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

A load takes a policy (:mod:`.policy`: wait_complete by default, best_effort, timeout, cost_aware) and says
how many tokens arrived and from which tiers; afterwards the connector reports to the daemon what the load
was worth (ReportUsage: chunks whose prefill is skipped per source tier, cached tokens recomputed anyway),
best effort. Layer-by-layer loads and saves live in :mod:`.layerwise`, single-flight prefill in
:mod:`.prefill`.

Primitives:
    ConnectorConfig: data-plane choice, codec, lease and ticket TTLs, the engine's cost models.
    KVConnector: lookup, prefetch / cancel_prefetch, load, load_layerwise, store, begin_save, prefill_claim,
        report_usage.
    LoadResult, StoreResult: token-weighted outcomes (defined in :mod:`.outcomes`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import torch

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError, TierCacheError, UnavailableError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies.load import DeadlineModel, LoadPolicy, PrefillModel
from tiercache.tiers.base import TierLevel

from .client import TierCacheClient
from .dataplane import SlotMapping
from .kv import EngineKV, check_kv, chunk_to_kv, kv_to_chunk
from .layerwise import ChunkBuffers, LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult, usage_of
from .policy import WirePolicy, to_wire
from .prefill import PrefillClaim
from .results import LoadLease, SlotRef, StoreTicket, StreamChunk

__all__ = ["ConnectorConfig", "KVConnector", "LoadResult", "StoreResult"]

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
        prefill: the engine's prefill model, declared at registration (needed for cost-aware loads).
        deadline: the engine's load-deadline model, declared at registration (timeout loads without a
            timeout of their own).
        prefill_ttl_s: lifetime of a single-flight prefill claim, renewed by each publication (0: the
            daemon's lease TTL); a leader that dies loses its claim after this long.
        report_usage: after each load, tell the daemon which loaded tokens the engine skips and which cached
            tokens it recomputes (turn off for an engine that reports with ``report_usage`` itself).
    """

    force_remote: bool = False
    codec: Codec = Codec.RAW
    load_ttl_s: float = 0.0
    store_ttl_s: float = 0.0
    prefill: PrefillModel | None = None
    deadline: DeadlineModel | None = None
    prefill_ttl_s: float = 0.0
    report_usage: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec):
            raise InvalidArgumentError("codec", f"must be a Codec, got {self.codec!r}")
        for name in ("load_ttl_s", "store_ttl_s", "prefill_ttl_s"):
            if not getattr(self, name) >= 0:
                raise InvalidArgumentError(name, f"must be >= 0, got {getattr(self, name)!r}")
        if self.prefill is not None and not isinstance(self.prefill, PrefillModel):
            raise InvalidArgumentError("prefill", f"must be a PrefillModel, got {self.prefill!r}")
        if self.deadline is not None and not isinstance(self.deadline, DeadlineModel):
            raise InvalidArgumentError("deadline", f"must be a DeadlineModel, got {self.deadline!r}")


Policy = LoadPolicy | None
"""A load policy (:class:`~tiercache.policies.load.LoadPolicy`), or None (wait_complete)."""


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
        if self.config.prefill is not None or self.config.deadline is not None:
            client.declare_models(namespace, self.config.prefill, self.config.deadline)

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

    def cancel_prefetch(self, prefetch_id: int) -> int:
        """Drop promotions of a prefetch that have not started (its request went away); 0 on daemon trouble.

        ``prefetch_id`` comes from ``client.start_prefetch`` or ``client.lookup(..., prefetch=True)``.
        """
        try:
            return self.client.cancel_prefetch(self.namespace, prefetch_id)
        except TierCacheError as exc:
            logger.warning("tiercache cancel_prefetch failed (%s)", exc)
            return 0

    # ------------------------------------------------------------------ load

    def load(self, tokens: Tokens, kv: EngineKV, policy: Policy = None) -> LoadResult:
        """Copy the cached prefix of ``tokens`` that ``policy`` chooses into the engine's tensors.

        Args:
            tokens: the prompt's token ids (only full chunks are considered).
            kv: the engine's tensors for this request, large enough for every full chunk of ``tokens``.
            policy: how much to take and how long to wait (default: wait_complete).

        Returns:
            How many tokens were looked up, cached, offered and loaded (and from which tiers); the engine
            recomputes the rest.

        Raises:
            InvalidArgumentError: ``tokens``, ``kv`` or ``policy`` are malformed (engine bugs, not daemon
                trouble).
            Exception: whatever the engine-side copy raises (the lease is released first).
        """
        keys = chunk_keys(self.namespace, tokens)
        looked_up = len(keys) * self._layout.chunk_tokens
        check_kv(self._layout, kv, len(keys))
        wire = self._wire(policy, len(tokens))
        if not keys:
            return LoadResult(0, 0, 0)
        remote = self.config.force_remote
        try:
            remote = remote or self.client.slot_mapping(self.namespace) is None
            if remote:
                result = self._load_stream(keys, kv, looked_up)
            else:
                result = self._load_shm(keys, kv, looked_up, wire, len(tokens))
        except TierCacheError as exc:
            logger.warning("tiercache load failed (%s); recomputing %d tokens", exc, looked_up)
            return LoadResult(looked_up, 0, 0, remote)
        self._report(result)
        return result

    def load_layerwise(self, tokens: Tokens, kv: EngineKV, policy: Policy = None) -> LayerwiseLoad:
        """Start loading the cached prefix layer by layer; see :class:`~.layerwise.LayerwiseLoad`.

        The lease is taken now (one control call); the copies run in a background thread, all chunks of
        layer 0 first, then layer 1, ... Daemon trouble gives a load of 0 tokens, never an exception.

        Raises:
            InvalidArgumentError: ``tokens``, ``kv`` or ``policy`` are malformed.
        """
        keys = chunk_keys(self.namespace, tokens)
        looked_up = len(keys) * self._layout.chunk_tokens
        check_kv(self._layout, kv, len(keys))
        wire = self._wire(policy, len(tokens))
        nothing = LoadResult(looked_up, 0, 0)
        if not keys:
            return self._layerwise(kv, None, nothing)
        try:
            if self.config.force_remote or self.client.slot_mapping(self.namespace) is None:
                chunks = self.client.stream_load(self.namespace, keys, codec=self.config.codec)
                hit = len(chunks) * self._layout.chunk_tokens
                planned = LoadResult(looked_up, hit, hit, remote=True, tokens_cached=hit)
                views = [(c.index, torch.frombuffer(c.data, dtype=torch.uint8)) for c in chunks]
                return self._layerwise(kv, nullcontext(views) if views else None, planned)
            started = self._clock()
            lease = self._acquire(keys, wire, len(tokens))
        except TierCacheError as exc:
            logger.warning("tiercache load failed (%s); recomputing %d tokens", exc, looked_up)
            return self._layerwise(kv, None, LoadResult(looked_up, 0, 0, self.config.force_remote))
        refs = self._checked(_prefix(lease.slots))
        planned = self._planned(lease, refs, looked_up)
        if lease.lease_id == 0 or not refs:
            if lease.lease_id:
                self._release(lease)
            return self._layerwise(kv, None, planned)
        deadline = started + lease.expires_in_s

        @contextmanager
        def buffers() -> Iterator[list[tuple[int, torch.Tensor]]]:
            with self._current_mapping().use() as slots:
                yield [(ref.index, slots.view(ref)) for ref in refs]

        return LayerwiseLoad(
            self._layout,
            kv,
            buffers(),
            planned,
            valid=lambda: self._clock() < deadline,
            release=lambda: self._release(lease),
            on_result=self._report,
        )

    def report_usage(self, result: LoadResult) -> None:
        """Tell the daemon what a load was worth (best effort; never raises on daemon trouble)."""
        chunks, recomputed = usage_of(result, self._layout.chunk_tokens)
        if not chunks and not recomputed:
            return
        try:
            self.client.report_usage(self.namespace, chunks, recomputed, wait=False)
        except TierCacheError as exc:
            logger.info("tiercache usage report failed (%s)", exc)

    def _report(self, result: LoadResult) -> None:
        if self.config.report_usage:
            self.report_usage(result)

    def _layerwise(self, kv: EngineKV, buffers: ChunkBuffers | None, planned: LoadResult) -> LayerwiseLoad:
        return LayerwiseLoad(
            self._layout,
            kv,
            buffers,
            planned,
            valid=lambda: True,
            release=lambda: None,
            on_result=self._report,
        )

    def _wire(self, policy: Policy, prompt_tokens: int) -> WirePolicy:
        wire = to_wire(policy, prompt_tokens)
        if wire.prefill is not None:
            self.client.declare_models(self.namespace, wire.prefill, self.config.deadline)
        return wire

    def _acquire(self, keys: list[bytes], wire: WirePolicy, prompt_tokens: int) -> LoadLease:
        return self.client.acquire_load(
            self.namespace,
            keys,
            ttl_s=self.config.load_ttl_s,
            policy=wire.kind,
            timeout_s=wire.timeout_s,
            prompt_tokens=prompt_tokens,
        )

    def _checked(self, refs: list[SlotRef]) -> list[SlotRef]:
        """The prefix of ``refs`` whose slots hold a whole chunk."""
        for i, ref in enumerate(refs):
            if ref.nbytes != self._layout.chunk_bytes:
                logger.warning(
                    "slot of chunk %d holds %d bytes, expected %d",
                    ref.index,
                    ref.nbytes,
                    self._layout.chunk_bytes,
                )
                return refs[:i]
        return refs

    def _planned(self, lease: LoadLease, refs: list[SlotRef], looked_up: int) -> LoadResult:
        """The result of a load once every chunk of ``refs`` has arrived."""
        c_tokens = self._layout.chunk_tokens
        sources: dict[TierLevel, int] = {}
        for ref in refs:
            if ref.source is not None:
                sources[ref.source] = sources.get(ref.source, 0) + c_tokens
        return LoadResult(
            looked_up,
            len(_prefix(lease.slots)) * c_tokens,
            len(refs) * c_tokens,
            tokens_cached=lease.cached * c_tokens,
            sources=MappingProxyType(sources),
            estimated_load_s=lease.estimated_load_s,
            estimated_recompute_s=lease.estimated_recompute_s,
        )

    def _current_mapping(self) -> SlotMapping:
        """The segment of the current registration (a call may just have re-registered after a restart)."""
        mapping = self.client.slot_mapping(self.namespace)
        if mapping is None:
            raise UnavailableError("data plane: the daemon's shared memory is no longer reachable")
        return mapping

    def _load_shm(
        self, keys: list[bytes], kv: EngineKV, looked_up: int, wire: WirePolicy, prompt_tokens: int
    ) -> LoadResult:
        started = self._clock()
        lease = self._acquire(keys, wire, prompt_tokens)
        refs = self._checked(_prefix(lease.slots))
        planned = self._planned(lease, refs, looked_up)
        if lease.lease_id == 0:
            return planned
        copied = 0
        in_time = False
        try:
            with self._current_mapping().use() as slots:
                for ref in refs:
                    chunk_to_kv(self._layout, slots.view(ref), kv, ref.index)
                    copied += 1
            # The lease's TTL started at the daemon after ``started``: by the local clock it held throughout.
            in_time = self._clock() < started + lease.expires_in_s
        finally:
            released = self._release(lease, wait=not in_time)
        if released is False or (released is None and not in_time):
            logger.warning("load lease %d lapsed during the copy; recomputing", lease.lease_id)
            copied = 0
        if copied < len(refs):
            return LoadResult(looked_up, planned.tokens_hit, 0, tokens_cached=planned.tokens_cached)
        return planned

    def _release(self, lease: LoadLease, wait: bool = True) -> bool | None:
        """Release a lease; None when not waited for, or when the daemon could not answer (it then expires
        at its TTL)."""
        try:
            if not wait:
                self.client.release_load_nowait(self.namespace, lease.lease_id)
                return None
            return self.client.release_load(self.namespace, lease.lease_id)
        except TierCacheError as exc:
            logger.warning("releasing load lease %d failed (%s); it expires at its TTL", lease.lease_id, exc)
            return None

    def _load_stream(self, keys: list[bytes], kv: EngineKV, looked_up: int) -> LoadResult:
        def consume(chunk: StreamChunk) -> None:
            chunk_to_kv(self._layout, torch.frombuffer(chunk.data, dtype=torch.uint8), kv, chunk.index)

        loaded = self.client.stream_load_into(self.namespace, keys, consume, codec=self.config.codec)
        hit = loaded * self._layout.chunk_tokens
        return LoadResult(looked_up, hit, hit, remote=True, tokens_cached=hit)

    # ------------------------------------------------------------------ layerwise save and single flight

    def begin_save(self, tokens: Tokens) -> LayerwiseSave:
        """Reserve room for the prompt's new full chunks, to be filled layer by layer; see
        :class:`~.layerwise.LayerwiseSave`. Nothing is visible to anyone before ``commit``.

        Daemon trouble gives a save that stores nothing (its calls are no-ops), never an exception.
        """
        keys = chunk_keys(self.namespace, tokens)
        layout = self._layout
        if not keys:
            return LayerwiseSave(layout, 0, None, lambda: 0, lambda: None, 0, False)
        try:
            if self.config.force_remote or self.client.slot_mapping(self.namespace) is None:
                return self._begin_save_stream(keys)
            ticket = self.client.begin_store(self.namespace, keys, ttl_s=self.config.store_ttl_s)
        except TierCacheError as exc:
            logger.warning("tiercache begin_save failed (%s); not caching", exc)
            return LayerwiseSave(layout, len(keys), None, lambda: 0, lambda: None, 0, False)
        bad = [r for r in ticket.slots if r.nbytes != layout.chunk_bytes or not 0 <= r.index < len(keys)]
        if bad or not ticket.slots:
            if bad:
                logger.warning(
                    "store slot for chunk %d holds %d bytes; not caching", bad[0].index, bad[0].nbytes
                )
            self._abort(ticket)
            return LayerwiseSave(layout, len(keys), None, lambda: 0, lambda: None, len(ticket.skipped), False)

        @contextmanager
        def buffers() -> Iterator[list[tuple[int, torch.Tensor]]]:
            with self._current_mapping().use() as slots:
                yield [(ref.index, slots.view(ref)) for ref in ticket.slots]

        return LayerwiseSave(
            layout,
            len(keys),
            buffers(),
            commit=lambda: self.client.commit_store(self.namespace, ticket.ticket_id),
            abort=lambda: self._abort(ticket),
            skipped_chunks=len(ticket.skipped),
            remote=False,
        )

    def _begin_save_stream(self, keys: list[bytes]) -> LayerwiseSave:
        """A layerwise save over the byte stream: layers are staged locally, the chunks sent at commit."""
        cached = self.client.lookup(self.namespace, keys).chunks
        staged = [
            (i, torch.empty(self._layout.chunk_bytes, dtype=torch.uint8)) for i in range(cached, len(keys))
        ]

        def commit() -> int:
            result = self.client.stream_store(
                self.namespace,
                keys[cached:],
                (buf for _, buf in staged),
                start_depth=cached,
                codec=self.config.codec,
            )
            return result.stored

        return LayerwiseSave(
            self._layout,
            len(keys),
            nullcontext(staged) if staged else None,
            commit,
            lambda: None,
            cached,
            True,
        )

    def prefill_claim(self, tokens: Tokens, ttl_s: float | None = None) -> PrefillClaim:
        """Coordinate the prefill of the prompt's uncached chunks with concurrent requests; see
        :class:`~.prefill.PrefillClaim`. Daemon trouble gives an uncoordinated claim (compute everything).

        Args:
            tokens: the prompt's token ids.
            ttl_s: the claim's lifetime, renewed by each publication (None: ``config.prefill_ttl_s``).
        """
        keys = chunk_keys(self.namespace, tokens)
        ttl = self.config.prefill_ttl_s if ttl_s is None else ttl_s
        info = None
        if keys:
            try:
                info = self.client.claim_prefill(self.namespace, keys, ttl)
            except TierCacheError as exc:
                logger.warning("tiercache prefill claim failed (%s); computing without coordination", exc)

        def mapping() -> SlotMapping | None:
            if self.config.force_remote:
                return None
            return self.client.slot_mapping(self.namespace)

        return PrefillClaim(self.client, self.namespace, keys, info, mapping, ttl, self.config.store_ttl_s)

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

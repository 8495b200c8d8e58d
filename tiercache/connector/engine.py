"""Engine-facing helpers: load a prompt's cached prefix into the engine's KV tensors, store what it computed.

:class:`KVConnector` binds a client to one namespace. Its calls never raise on daemon trouble (down, slow,
restarting, out of space, bad state): they log a warning and report 0 tokens loaded / stored, so that the
engine recomputes. They do raise on the engine's own mistakes (KV tensors that do not match the layout) and
let exceptions of the engine-side copy propagate — after releasing the lease or aborting the store.

The data plane (:mod:`.dataplane`) is chosen once, in :mod:`.choice`, through the transfer handlers of
:mod:`.handlers`: at construction under ``ConnectorConfig.data_plane`` ``shm`` or ``stream``; under ``auto``,
at the first call that moves bytes, the daemon's shared-memory slots when its segment can be mapped in this
process (:mod:`.shm_plane`), else the byte stream (:mod:`.stream_plane`), chosen again only when the
namespace was registered again (a daemon restart).

A load takes a policy (:mod:`.policy`: wait_complete by default, best_effort, timeout, cost_aware) and says
how many tokens arrived and from which tiers; afterwards the connector reports to the daemon what the load
was worth (chunks whose prefill is skipped per source tier, cached tokens recomputed anyway), best effort,
carried by its next call (:mod:`.settle`). Layer-by-layer loads and saves live in :mod:`.layerwise`,
single-flight prefill in :mod:`.prefill`.

Primitives:
    KVConnector: data_plane, lookup, prefetch / cancel_prefetch, load, load_layerwise, store, begin_save,
        prefill_claim, report_usage.
    ConnectorConfig: data-plane choice, codec, lease and ticket TTLs, the engine's cost models (defined in
        :mod:`.config`).
    LoadResult, StoreResult: token-weighted outcomes (defined in :mod:`.outcomes`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies.load import LoadPolicy

from .choice import DataPlaneChoice
from .client import TierCacheClient
from .config import ConnectorConfig
from .dataplane import DataPlane
from .kv import EngineKV
from .kv_check import check_kv
from .layerwise import LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult, usage_of
from .policy import WirePolicy, to_wire
from .prefill import PrefillLease

logger = logging.getLogger(__name__)

Tokens = Sequence[int] | np.ndarray

Policy = LoadPolicy | None
"""A load policy (:class:`~tiercache.policies.load.LoadPolicy`), or None (wait_complete)."""


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
        self._choice = DataPlaneChoice(client, namespace, self.config, clock)
        if self.config.prefill is not None or self.config.deadline is not None:
            client.declare_models(namespace, self.config.prefill, self.config.deadline)

    def data_plane(self) -> DataPlane:
        """The data plane this connector moves bytes with (see :class:`~.choice.DataPlaneChoice`).

        Raises:
            TierCacheError: the daemon could not be asked (down, refused the namespace).
        """
        return self._choice.current()

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
        plane: DataPlane | None = None
        try:
            plane = self.data_plane()
            result = plane.load(keys, kv, wire, len(tokens))
        except TierCacheError as exc:
            logger.warning("tiercache load failed (%s); recomputing %d tokens", exc, looked_up)
            return LoadResult(looked_up, 0, 0, self._remote(plane))
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
        if not keys:
            return LayerwiseLoad.unleased(self._layout, kv, LoadResult(looked_up, 0, 0), self._report)
        plane: DataPlane | None = None
        try:
            plane = self.data_plane()
            return plane.load_layerwise(keys, kv, wire, len(tokens), self._report)
        except TierCacheError as exc:
            logger.warning("tiercache load failed (%s); recomputing %d tokens", exc, looked_up)
            failed = LoadResult(looked_up, 0, 0, self._remote(plane))
            return LayerwiseLoad.unleased(self._layout, kv, failed, self._report)

    def report_usage(self, result: LoadResult) -> None:
        """Tell the daemon what a load was worth, with the namespace's next call (best effort: deferred, see
        :meth:`~.client.TierCacheClient.defer_usage`; never raises on daemon trouble)."""
        chunks, recomputed = usage_of(result, self._layout.chunk_tokens)
        if not chunks and not recomputed:
            return
        self.client.defer_usage(self.namespace, chunks, recomputed, loaded_tokens=result.sources)

    def _report(self, result: LoadResult) -> None:
        if self.config.report_usage:
            self.report_usage(result)

    def _wire(self, policy: Policy, prompt_tokens: int) -> WirePolicy:
        wire = to_wire(policy, prompt_tokens)
        if wire.prefill is not None:
            self.client.declare_models(self.namespace, wire.prefill, self.config.deadline)
        return wire

    @staticmethod
    def _remote(plane: DataPlane | None) -> bool:
        """What a failed call reports as ``remote``: its data plane's (None: the choice itself failed, which
        a forced byte stream never does)."""
        return plane is not None and plane.remote

    # ------------------------------------------------------------------ store, layerwise save, single flight

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
        plane: DataPlane | None = None
        try:
            plane = self.data_plane()
            return plane.store(keys, kv)
        except TierCacheError as exc:
            logger.warning("tiercache store failed (%s); %d tokens not cached", exc, offered)
            return StoreResult(offered, 0, 0, self._remote(plane))

    def begin_save(self, tokens: Tokens) -> LayerwiseSave:
        """Reserve room for the prompt's new full chunks, to be filled layer by layer; see
        :class:`~.layerwise.LayerwiseSave`. Nothing is visible to anyone before ``commit``.

        Daemon trouble gives a save that stores nothing (its calls are no-ops), never an exception.
        """
        keys = chunk_keys(self.namespace, tokens)
        if not keys:
            return LayerwiseSave.empty(self._layout, 0, 0, remote=False)
        try:
            return self.data_plane().begin_save(keys)
        except TierCacheError as exc:
            logger.warning("tiercache begin_save failed (%s); not caching", exc)
            return LayerwiseSave.empty(self._layout, len(keys), 0, remote=False)

    def prefill_claim(self, tokens: Tokens, ttl_s: float | None = None) -> PrefillLease:
        """Coordinate the prefill of the prompt's uncached chunks with concurrent requests; see
        :class:`~.prefill.PrefillLease`. Daemon trouble gives an uncoordinated lease (compute everything).

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
        return PrefillLease(self.client, self.namespace, keys, info, self.data_plane, ttl)

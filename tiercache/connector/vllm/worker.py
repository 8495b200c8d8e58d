"""The worker-side connector (in vLLM's Worker): leases and copies loads, fills and commits saves.

* ``register_kv_caches`` learns the layer order and checks each layer's cache against the backend layout
  (:mod:`.layout`); an unexpected layout disables the connector (logged) rather than copy wrong bytes.
* ``start_load_kv`` leases each request's cached chunks (one AcquireLoad per request) and starts a
  :class:`~.loads.LayerLoader`; ``wait_for_layer_load`` waits for one layer; chunks the daemon no longer
  offers, leases that lapsed and failed copies become ``get_block_ids_with_load_errors`` (vLLM then
  recomputes those blocks when its ``kv_load_failure_policy`` is ``recompute``).
* ``save_kv_layer`` reserves slots at a request's first save (one BeginStore: nothing is visible yet) and
  copies layer l of the chunks this step completed; ``wait_for_save`` commits the reservation in the step
  that completed the prompt's last full chunk — only if every chunk was copied at every layer — and drops
  reservations the scheduler reports finished, aborted or preempted.

Daemon trouble is logged and counted, never raised into vLLM.

Primitives:
    WorkerSide: register_kv_caches, start_load_kv, wait_for_layer_load, save_kv_layer, wait_for_save,
        get_block_ids_with_load_errors, shutdown; ``load_failures`` / ``save_failures`` counters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies.load import LoadPolicyKind

from ..client import TierCacheClient
from ..results import SlotRef, StoreGrant
from ..segments import SlotMapping
from .config import VllmConnectorConfig
from .layout import block_planes, check_cache, chunk_planes, copy_from_cache
from .loads import LayerLoader, LeasedLoad
from .metadata import LoadSpec, SaveSpec, TierCacheMetadata
from .namespace import EngineIdentity

logger = logging.getLogger(__name__)


@dataclass
class _OpenSave:
    """A request's store reservation while its chunks are being copied."""

    namespace: Namespace
    grant: StoreGrant
    mapping: SlotMapping
    slots: dict[int, SlotRef]
    layers_copied: dict[int, int] = field(default_factory=dict)


class WorkerSide:
    """The worker role of :class:`~tiercache.connector.vllm.TierCacheConnector`."""

    def __init__(
        self,
        identity: EngineIdentity,
        client: TierCacheClient,
        config: VllmConnectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._identity = identity
        self._layout = identity.layout
        self._client = client
        self._config = config
        self._timeout_s = config.timeout_s if config.load_policy is LoadPolicyKind.TIMEOUT else 0.0
        self._clock = clock
        self._layers: dict[str, int] = {}
        self._caches: list[torch.Tensor] = []
        self._loader: LayerLoader | None = None
        self._errors: set[int] = set()
        self._saves: dict[str, _OpenSave] = {}
        self._step_saves: list[SaveSpec] = []
        self.load_failures = 0
        self.save_failures = 0

    @property
    def enabled(self) -> bool:
        """Whether the KV caches were registered and match the layout."""
        return bool(self._caches)

    def register_kv_caches(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """Learn the layers (in vLLM's order) and view each as blocks of bytes."""
        backend = self._identity.backend
        if len(kv_caches) != self._layout.num_layers:
            logger.error(
                "tiercache disabled: %d KV cache layers, the model config says %d",
                len(kv_caches),
                self._layout.num_layers,
            )
            return
        try:
            for name, tensor in kv_caches.items():
                check_cache(backend, self._layout, f"kv_caches[{name!r}]", tensor)
        except InvalidArgumentError as exc:
            logger.error("tiercache disabled: unexpected KV cache layout (%s)", exc)
            return
        self._layers = {name: i for i, name in enumerate(kv_caches)}
        self._caches = [block_planes(backend, t) for t in kv_caches.values()]

    # ------------------------------------------------------------------ loads

    def start_load_kv(self, meta: TierCacheMetadata) -> None:
        """Lease every request's chunks and start copying them (layer by layer, in the background)."""
        self._wait_loader()
        if not meta.loads:
            return
        leased = [load for spec in meta.loads if (load := self._lease(spec)) is not None]
        if leased:
            self._loader = LayerLoader(
                self._client, self._identity.backend, self._layout, self._caches, leased, self._clock
            )

    def _lease(self, spec: LoadSpec) -> LeasedLoad | None:
        """Lease the request's chunks; blocks the daemon does not offer now become load errors."""
        targets = set(spec.block_ids[spec.first_block :])
        if not self.enabled:
            self._errors |= targets
            return None
        ns = self._identity.namespace(spec.adapter, spec.cache_salt)
        keys = chunk_keys(ns, spec.tokens)
        if self._config.prefill is not None:
            self._client.declare_models(ns, self._config.prefill)  # sent with the (first) registration
        started = self._clock()
        try:
            lease = self._client.acquire_load(
                ns, keys, policy=self._config.load_policy, timeout_s=self._timeout_s
            )
            mapping = self._client.slot_mapping(ns)
        except TierCacheError as exc:
            self.load_failures += 1
            logger.warning("tiercache load of request %s failed (%s); vLLM recomputes", spec.req_id, exc)
            self._errors |= targets
            return None
        by_index = {r.index: r for r in lease.slots}
        refs: list[SlotRef] = []
        while len(refs) in by_index and by_index[len(refs)].nbytes == self._layout.chunk_bytes:
            refs.append(by_index[len(refs)])
        per = self._layout.chunk_tokens // self._layout.page_tokens
        got = len(refs) * per
        if got < len(spec.block_ids):
            self.load_failures += 1
            logger.info("request %s: %d of %d chunks still cached", spec.req_id, len(refs), len(keys))
            self._errors |= set(spec.block_ids[max(got, spec.first_block) :])
        if mapping is None or not refs:
            if lease.lease_id:
                self._release(ns, lease.lease_id)
            if mapping is None:
                self._errors |= targets
            return None
        return LeasedLoad(ns, lease, tuple(refs), mapping, spec.block_ids[:got], spec.first_block, started)

    def _release(self, ns: Namespace, lease_id: int) -> None:
        try:
            self._client.release_load(ns, lease_id)
        except TierCacheError as exc:
            logger.warning("releasing load lease %d failed (%s); it lapses at its TTL", lease_id, exc)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until this layer of the step's loads is in the cache."""
        loader, layer = self._loader, self._layers.get(layer_name)
        if loader is not None and layer is not None:
            loader.wait(layer)

    def _wait_loader(self) -> None:
        loader, self._loader = self._loader, None
        if loader is not None:
            failed = loader.finish()
            if failed:
                self.load_failures += 1
            self._errors |= failed

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks of this step's loads whose KV did not arrive intact (vLLM recomputes them)."""
        self._wait_loader()
        errors, self._errors = self._errors, set()
        return errors

    # ------------------------------------------------------------------ saves

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, meta: TierCacheMetadata) -> None:
        """Copy this layer of the chunks the step completed into their reserved slots."""
        layer = self._layers.get(layer_name)
        if layer is None or not meta.saves:
            return
        if layer == 0:
            self._step_saves = list(meta.saves)
            for spec in meta.saves:
                if spec.tokens and spec.req_id not in self._saves:
                    self._open(spec)
        cache = self._caches[layer]
        per = self._layout.chunk_tokens // self._layout.page_tokens
        for spec in self._step_saves:
            save = self._saves.get(spec.req_id)
            if save is None:
                continue
            try:
                with save.mapping.use() as slots:
                    for pos in spec.chunks:
                        ref = save.slots.get(pos)
                        if ref is None:
                            continue  # cached already, or being stored by another engine
                        blocks = spec.block_ids[pos * per : (pos + 1) * per]
                        index = torch.tensor(blocks, dtype=torch.int64, device=cache.device)
                        copy_from_cache(
                            cache,
                            chunk_planes(self._identity.backend, self._layout, slots.view(ref), layer),
                            0,
                            index,
                        )
                        save.layers_copied[pos] = save.layers_copied.get(pos, 0) + 1
            except TierCacheError as exc:
                logger.warning("tiercache save of request %s failed (%s); not caching", spec.req_id, exc)
                self._drop(spec.req_id)

    def _open(self, spec: SaveSpec) -> None:
        """Reserve slots for chunks ``start_chunk ..`` of the request (invisible until committed)."""
        if not self.enabled:
            return
        ns = self._identity.namespace(spec.adapter, spec.cache_salt)
        keys = chunk_keys(ns, spec.tokens)[spec.start_chunk :]
        if not keys:
            return
        try:
            grant = self._client.begin_store(ns, keys, start_depth=spec.start_chunk)
            mapping = self._client.slot_mapping(ns)
        except TierCacheError as exc:
            self.save_failures += 1
            logger.warning("tiercache store of request %s failed (%s); not caching", spec.req_id, exc)
            return
        if mapping is None or not grant.slots:
            self._abort(ns, grant)
            return
        slots = {spec.start_chunk + r.index: r for r in grant.slots if r.nbytes == self._layout.chunk_bytes}
        if len(slots) != len(grant.slots):
            self._abort(ns, grant)
            return
        self._saves[spec.req_id] = _OpenSave(ns, grant, mapping, slots)

    def wait_for_save(self, meta: TierCacheMetadata) -> None:
        """Commit the reservations this step completed; drop those the scheduler gave up."""
        if self._caches and self._caches[0].device.type == "cuda" and self._step_saves:
            torch.cuda.current_stream(self._caches[0].device).synchronize()
        for spec in self._step_saves:
            save = self._saves.get(spec.req_id)
            if save is None or not spec.commit:
                continue
            del self._saves[spec.req_id]
            complete = all(save.layers_copied.get(pos) == self._layout.num_layers for pos in save.slots)
            if not complete:
                logger.warning("request %s: a chunk missed a layer; not caching", spec.req_id)
                self._abort(save.namespace, save.grant)
                continue
            try:
                self._client.commit_store(save.namespace, save.grant.ticket_id)
            except TierCacheError as exc:
                self.save_failures += 1
                logger.warning("tiercache commit of request %s failed (%s); not caching", spec.req_id, exc)
                self._abort(save.namespace, save.grant)
        self._step_saves = []
        for req_id in meta.aborts:
            self._drop(req_id)

    def _drop(self, req_id: str) -> None:
        save = self._saves.pop(req_id, None)
        if save is not None:
            self._abort(save.namespace, save.grant)

    def _abort(self, ns: Namespace, grant: StoreGrant) -> None:
        try:
            self._client.abort_store(ns, grant.ticket_id)
        except TierCacheError as exc:
            logger.warning("aborting store ticket %d failed (%s); it lapses at its TTL", grant.ticket_id, exc)

    def shutdown(self) -> None:
        """Finish the loads, drop open reservations."""
        self._wait_loader()
        for req_id in list(self._saves):
            self._drop(req_id)

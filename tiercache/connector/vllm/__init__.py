"""tiercache as a vLLM KV connector: ``TierCacheConnector`` (``KVConnectorBase_V1``).

vLLM loads it with::

    KVTransferConfig(
        kv_connector="TierCacheConnector",
        kv_connector_module_path="tiercache.connector.vllm",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"address": "unix:/run/user/1000/tiercache/daemon.sock"},
    )

One instance per role and process: the SCHEDULER role (EngineCore) looks prompts up and plans each step
(:mod:`.scheduler`), the WORKER role turns each step's plan into the connector's transfers between the daemon
(its shared memory, or its byte stream: ``data_plane``) and vLLM's paged KV cache (:mod:`.worker`,
:mod:`.loads`, :mod:`.saves`), with the connector's own paged copy, loads and saves
(:mod:`tiercache.connector.kv`, :mod:`tiercache.connector.layerwise`). Both build the same namespaces from the
engine's config (:mod:`.namespace`) and parse the same options (:mod:`.config`); the step's plan travels as
:class:`~.metadata.TierCacheMetadata`.

Per request, vLLM's ``kv_transfer_params`` turn tiercache off for that request (:mod:`.params`):
``{"tiercache_skip_load": true}`` (no lookup, no load), ``{"tiercache_skip_save": true}`` (nothing stored).
A bad value logs a warning naming the key and the request runs with the defaults (vLLM gives a connector
no way to fail one request).

Modules:
    ahead: registering the namespace (and mapping the segment) at engine start, in the background.
    config: ``VllmConnectorConfig`` from ``kv_connector_extra_config``.
    namespace: the engine's and each request's namespace.
    layout: vLLM's CPU and GPU (flash) cache layouts, each layer viewed as block planes.
    kv_events: tiercache's tiers in vLLM's KV events (``BlockStored`` / ``BlockRemoved`` per tier), from
        the daemon's event feed, when vLLM runs with ``--kv-events-config``.
    metadata: the per-step plan (loads, saves, preempted saving requests).
    params: per-request choices from ``kv_transfer_params`` (skip load, skip save).
    scheduler: ``SchedulerSide``.
    stats: tiercache's counters in vLLM's stats (logged, and on vLLM's ``/metrics`` as ``vllm:tiercache_*``).
    loads: a request's load as a ``LayerwiseLoad`` from leased slots, or a byte-stream receive.
    saves: ``SaveQueue`` (a background thread filling the data plane's ``LayerwiseSave``, two-phase).
    worker: ``WorkerSide``.

Primitives:
    TierCacheConnector: the connector class vLLM instantiates.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.platforms import current_platform

from ..client import TierCacheClient
from ..watch import EventWatch
from .config import VllmConnectorConfig
from .kv_events import KVEventsBridge
from .layout import BackendLayout
from .metadata import TierCacheMetadata
from .namespace import engine_identity
from .scheduler import SchedulerSide
from .stats import StatsTaker, TierCachePromMetrics, TierCacheStats, scheduler_counters, worker_counters
from .worker import WorkerSide

__all__ = ["TierCacheConnector", "TierCacheMetadata", "VllmConnectorConfig"]

logger = logging.getLogger(__name__)


def _worker_ranks() -> tuple[int, int]:
    """This worker's (TP rank, PP rank) (0, 0 before vLLM's parallel groups exist)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)
    except (AssertionError, ImportError):
        return 0, 0


class TierCacheConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM's KV connector over a tiercache daemon (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        transfer = self._kv_transfer_config
        self.config = VllmConnectorConfig.from_extra_config(
            transfer.kv_connector_extra_config, int(vllm_config.cache_config.block_size)
        )
        if getattr(transfer, "kv_load_failure_policy", "recompute") != "recompute":
            logger.warning(
                "kv_load_failure_policy=%r: a chunk evicted between lookup and load fails its request;"
                " set it to 'recompute' to recompute instead",
                transfer.kv_load_failure_policy,
            )
        backend = BackendLayout.CPU if current_platform.is_cpu() else BackendLayout.FLASH
        scheduler = role == KVConnectorRole.SCHEDULER
        tp_rank, pp_rank = (0, 0) if scheduler else _worker_ranks()
        self.identity = engine_identity(vllm_config, backend, self.config.chunk_tokens, tp_rank, pp_rank)
        self.client = TierCacheClient.connect(
            self.config.address, token=self.config.token, timeout_s=self.config.timeout_s
        )
        self._scheduler = SchedulerSide(self.identity, self.client, self.config) if scheduler else None
        self._worker = None if scheduler else WorkerSide(self.identity, self.client, self.config)
        self._stats = StatsTaker()
        self.kv_events: KVEventsBridge | None = None
        self._watch: EventWatch | None = None
        events_config = getattr(vllm_config, "kv_events_config", None)
        events_on = events_config is not None and events_config.enable_kv_cache_events
        if scheduler and events_on and self.config.kv_events_chunks > 0:
            self.kv_events = KVEventsBridge(self.identity, self.config.kv_events_chunks)
            self._watch = EventWatch(
                self.client.endpoint, self.config.token, self.client.config.channel, self.kv_events.on_event
            ).start()

    # ------------------------------------------------------------------ worker side

    def _w(self) -> WorkerSide:
        assert self._worker is not None, "a worker-side call on the scheduler-side connector"
        return self._worker

    def _s(self) -> SchedulerSide:
        assert self._scheduler is not None, "a scheduler-side call on the worker-side connector"
        return self._scheduler

    def _meta(self) -> TierCacheMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TierCacheMetadata)
        return meta

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._w().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._w().start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._w().wait_for_layer_load(layer_name)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._w().before_forward(self._meta())

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Nothing per layer: the step's chunks are copied after the forward pass (``wait_for_save``)."""

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            self._w().wait_for_save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._w().get_finished(finished_req_ids) or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._w().get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.close()
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        self.client.close()

    # ------------------------------------------------------------------ stats (both sides: :mod:`.stats`)

    def get_kv_connector_stats(self) -> TierCacheStats | None:
        if self._worker is not None:
            return self._stats.take(worker_counters(self._worker))
        return self._stats.take(scheduler_counters(self._s()))

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> TierCacheStats:
        return TierCacheStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> TierCachePromMetrics:
        return TierCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ------------------------------------------------------------------ scheduler side

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self._s().bind_local_hit(lambda request: int(kv_cache_manager.get_computed_blocks(request)[1]))

    def on_new_request(self, request: Any) -> None:
        if self.kv_events is not None:
            self.kv_events.note(request)
        self._s().on_new_request(request)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._s().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._s().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> TierCacheMetadata:
        return self._s().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._s().request_finished(request, block_ids)

    def take_events(self) -> list[Any]:
        """tiercache's tiers as vLLM KV events, when vLLM's KV events are on (:mod:`.kv_events`)."""
        return self.kv_events.take_events() if self.kv_events is not None else []

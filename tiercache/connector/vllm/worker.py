"""The worker-side connector (in vLLM's Worker): leases and copies loads, fills and commits saves.

* ``register_kv_caches`` learns the layer order and checks each layer's cache against the backend layout
  (:mod:`.layout`); an unexpected layout disables the connector (logged) rather than copy wrong bytes.
  It then registers the engine's namespace and maps the daemon's segment in the background
  (:mod:`.ahead`), so that the first request does not pay for it.
* ``start_load_kv`` takes each request's lease — the one the scheduler took when it looked the request up
  (TP = PP = 1: no call here), or its own (one AcquireLoad per request) — and starts the connector's
  :class:`~tiercache.connector.layerwise.LayerwiseLoad` into the request's blocks (:mod:`.loads`), which
  releases the lease after the copies (proving by the clock that it held, as for its own);
  ``wait_for_layer_load`` waits for one layer of every request; chunks the daemon no longer offers,
  leases that lapsed and failed copies become ``get_block_ids_with_load_errors`` (vLLM then recomputes
  those blocks when its ``kv_load_failure_policy`` is ``recompute``).
* After each load the worker tells the daemon what it was worth (deferred: it rides on the namespace's
  next call with the lease's release): the tokens it wrote into vLLM's blocks, which vLLM does not compute,
  as loaded and effective tokens by the tier each chunk came from, and the tokens it was asked to load and
  did not as recomputed. This is the daemon's only count of loaded tokens: a lease released unused counts
  nothing.
* The bytes move through the daemon's shared memory, or over its byte stream (``data_plane`` ``stream``,
  or ``auto`` when this process cannot map the daemon's segment: the daemon runs on another host): a
  streamed load needs no lease of its own (a lease the scheduler took is released unused), a streamed save
  stages the request's chunks in this process and sends them in one StreamStore at its commit.
* ``wait_for_save`` hands the full chunks the forward pass completed to a :class:`~.saves.SaveQueue`, which
  reserves, copies and commits them in a background thread (two-phase: a request publishes all of its
  chunks or none); ``get_finished`` reports the finished requests whose saves are done (vLLM held their
  blocks until then); ``before_forward`` finishes the copies of preempted requests before vLLM's next
  forward pass may write their blocks.

Daemon trouble is logged and counted, never raised into vLLM.

Primitives:
    WorkerSide: register_kv_caches, start_load_kv, wait_for_layer_load, before_forward, wait_for_save,
        get_finished, get_block_ids_with_load_errors, shutdown; ``load_failures`` / ``save_failures``
        counters, ``open_saves``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.keys import Namespace, chunk_keys
from tiercache.policies.load import LoadPolicyKind
from tiercache.tiers.base import TierLevel

from ..client import TierCacheClient
from ..config import ConnectorConfig, DataPlaneMode
from ..dataplane import DataPlane, Medium
from ..handlers import daemon_medium, open_plane
from ..layerwise import LayerwiseLoad
from ..results import LoadLease
from ..segments import SlotMapping
from ..stream_plane import ByteStreamPlane
from .ahead import connect_ahead
from .config import VllmConnectorConfig
from .layout import block_planes, check_cache
from .loads import LeasedLoad, leased_prefix, receive_into
from .metadata import LoadSpec, TierCacheMetadata
from .namespace import EngineIdentity
from .saves import SaveQueue

logger = logging.getLogger(__name__)


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
        self._loads: list[tuple[LayerwiseLoad, LeasedLoad, int]] = []  # (load, lease, tokens asked for)
        self._errors: set[int] = set()
        self._planes: dict[tuple[Namespace, Medium], DataPlane] = {}
        self._saves = SaveQueue(client, identity, lambda: self._caches, self.plane)
        self._connecting: threading.Thread | None = None
        self.load_failures = 0
        self.load_s = 0.0  # time the model steps waited for loads (steps that had some: see start_load_kv)
        self.loaded_tokens: dict[TierLevel, int] = {}  # written into vLLM's blocks, per source tier
        self.recomputed_tokens = 0  # asked to load, and not loaded

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
        self._connecting = connect_ahead(
            self._client,
            self._identity.namespace(),
            map_segment=self._config.data_plane is not DataPlaneMode.STREAM,
            prefill=self._config.prefill,
        )

    def plane(self, ns: Namespace) -> DataPlane:
        """The data plane of ``ns``: the handler of the medium ``data_plane`` resolves to (under ``auto``,
        shared memory when this process can map the daemon's segment), one per namespace and medium.

        Raises:
            TierCacheError: under ``auto``, the daemon could not be asked for the registration.
        """
        medium = daemon_medium(self._config.data_plane, lambda: self._client.slot_mapping(ns) is not None)
        plane = self._planes.get((ns, medium))
        if plane is None:
            built = open_plane(medium, self._client, ns, ConnectorConfig(), self._clock)
            plane = self._planes.setdefault((ns, medium), built)
        return plane

    def stream_plane(self, ns: Namespace) -> ByteStreamPlane | None:
        """The byte stream of ``ns`` when its bytes move that way (see :meth:`plane`), else None (shared
        memory).

        Raises:
            TierCacheError: under ``auto``, the daemon could not be asked for the registration.
        """
        plane = self.plane(ns)
        return plane if isinstance(plane, ByteStreamPlane) else None

    # ------------------------------------------------------------------ loads

    def start_load_kv(self, meta: TierCacheMetadata) -> None:
        """Take every request's lease and copy its chunks (into a CPU cache now; on CUDA layer by layer, in the
        background); a request over the byte stream is received now.

        Only a step with loads adds to ``load_s``: a counter that moved every decode step would make vLLM
        ship, aggregate and export the connector's stats with every step (measured: +0.5 ms per decode step
        at concurrency 1, ~9 % of it, on the serve bench's tiny model).
        """
        started, unfinished = time.perf_counter(), bool(self._loads)
        self._finish_loads()
        if meta.loads:
            self._start_loads(meta.loads)
        if unfinished or meta.loads:
            self.load_s += time.perf_counter() - started

    def _start_loads(self, specs: Sequence[LoadSpec]) -> None:
        for spec in specs:
            if self._streamed(spec):
                continue
            leased = self._lease(spec)
            if leased is not None:
                load = leased.start(self._client, self._layout, self._caches, self._clock)
                self._loads.append((load, leased, self._asked(spec)))

    def _streamed(self, spec: LoadSpec) -> bool:
        """Load the request over the byte stream when that is its namespace's data plane (True: done)."""
        if not self.enabled:
            return False
        ns = self._identity.namespace(spec.adapter, spec.cache_salt)
        try:
            plane = self.stream_plane(ns)
        except TierCacheError as exc:
            logger.debug("no data plane for request %s yet (%s)", spec.req_id, exc)
            return False  # the shared-memory path meets the same trouble and reports it
        if plane is None:
            return False
        if spec.lease is not None:
            self._client.defer_release(ns, spec.lease.lease_id)  # the stream leases while it sends
        keys = chunk_keys(ns, spec.tokens)
        failed, loaded = receive_into(plane, keys, self._caches, spec.block_ids, spec.first_block)
        if failed:
            self.load_failures += 1
            self._errors |= failed
        self._report(ns, loaded, self._asked(spec))
        return True

    def _asked(self, spec: LoadSpec) -> int:
        """The tokens vLLM counts on the load of ``spec`` for (it skips their prefill)."""
        return (len(spec.block_ids) - spec.first_block) * self._layout.page_tokens

    def _report(
        self, ns: Namespace, loaded: Mapping[TierLevel, int], asked: int, read: Sequence[bytes] = ()
    ) -> None:
        """Tell the daemon (deferred) what a request's load was worth: the tokens written into vLLM's blocks
        per source tier (loaded, and effective: vLLM skips them), the rest of ``asked`` recomputed, and the
        chunks ``read`` through the published index."""
        recomputed = max(0, asked - sum(loaded.values()))
        for tier, tokens in loaded.items():  # (for vLLM's stats: .stats)
            self.loaded_tokens[tier] = self.loaded_tokens.get(tier, 0) + tokens
        self.recomputed_tokens += recomputed
        if loaded or recomputed:
            self._client.defer_usage(
                ns, {}, recomputed, loaded_tokens=loaded, effective_tokens=loaded, read_keys=read
            )

    def _lease(self, spec: LoadSpec) -> LeasedLoad | None:
        """The request's lease (the scheduler's, or one taken now); blocks it does not cover become load
        errors."""
        targets = set(spec.block_ids[spec.first_block :])
        ns = self._identity.namespace(spec.adapter, spec.cache_salt)
        if not self.enabled:
            if spec.lease is not None:
                self._client.defer_release(ns, spec.lease.lease_id)  # nothing was copied from it
            self._errors |= targets
            return None  # (no usage report: without caches this worker talks to no daemon)
        try:
            lease, started = (
                (spec.lease, spec.leased_at) if spec.lease is not None else self._acquire(ns, spec)
            )
            mapping = self._client.slot_mapping(ns)
        except TierCacheError as exc:
            self.load_failures += 1
            logger.warning("tiercache load of request %s failed (%s); vLLM recomputes", spec.req_id, exc)
            if spec.lease is not None:
                self._client.defer_release(ns, spec.lease.lease_id)
            self._errors |= targets
            self._report(ns, {}, self._asked(spec))
            return None
        refs = leased_prefix(lease, self._layout.chunk_bytes)
        per = self._layout.chunk_tokens // self._layout.page_tokens
        if refs and refs[0].index * per > spec.first_block:
            refs = ()  # the lease starts past a block vLLM expects loaded: not usable
        got = (refs[-1].index + 1) * per if refs else 0
        if got < len(spec.block_ids):
            self.load_failures += 1
            chunks = len(spec.tokens) // self._layout.chunk_tokens
            logger.info("request %s: %d of %d chunks still cached", spec.req_id, len(refs), chunks)
            self._errors |= set(spec.block_ids[max(got, spec.first_block) :])
        usable, check = self._published_check(spec, mapping)
        if mapping is None or not refs or not usable:
            if lease.lease_id:
                self._client.defer_release(ns, lease.lease_id)  # nothing was copied from it
            if mapping is None or not usable:
                self._errors |= targets
            self._report(ns, {}, self._asked(spec))
            return None
        keys = tuple(p.key for p in spec.published)
        return LeasedLoad(
            ns, lease, refs, mapping, spec.block_ids[:got], spec.first_block, started, check, keys
        )

    def _published_check(
        self, spec: LoadSpec, mapping: SlotMapping | None
    ) -> tuple[bool, Callable[[], bool] | None]:
        """For chunks the scheduler found in the pool's published index: whether this worker can load them
        (False: it maps another pool, after a daemon restart), and the check, after the copy, that their
        entries are unchanged; (True, None) for a lease (it proves the copy itself)."""
        if not spec.published:
            return True, None
        index = None if mapping is None else mapping.index
        if mapping is None or index is None or mapping.name != spec.segment:
            self.load_failures += 1
            logger.info("request %s: the pool its chunks were found in is not mapped here", spec.req_id)
            return False, None
        published = spec.published
        return True, lambda: all(index.still(p) for p in published)

    def _acquire(self, ns: Namespace, spec: LoadSpec) -> tuple[LoadLease, float]:
        """Lease the request's chunks now (TP or PP > 1: this worker's shard); the lease, and the clock just
        before it was asked for."""
        if self._config.prefill is not None:
            self._client.declare_models(ns, self._config.prefill)  # sent with the (first) registration
        started = self._clock()
        lease = self._client.acquire_load(
            ns, chunk_keys(ns, spec.tokens), policy=self._config.load_policy, timeout_s=self._timeout_s
        )
        return lease, started

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until this layer of the step's loads is in the cache (on CUDA: the current stream waits)."""
        layer = self._layers.get(layer_name)
        if layer is not None and self._loads:
            started = time.perf_counter()
            for load, _, _ in self._loads:
                load.wait_layer(layer)
            self.load_s += time.perf_counter() - started

    def _finish_loads(self) -> None:
        loads, self._loads = self._loads, []
        for load, leased, asked in loads:
            loaded: Mapping[TierLevel, int] = {}
            read: tuple[bytes, ...] = ()
            if load.result().tokens_loaded == 0:
                self.load_failures += 1
                self._errors |= leased.target_blocks()
            else:
                loaded, read = leased.loaded_by_tier(self._layout), leased.read_keys
            load.close()
            self._report(leased.namespace, loaded, asked, read)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks of this step's loads whose KV did not arrive intact (vLLM recomputes them)."""
        self._finish_loads()
        errors, self._errors = self._errors, set()
        return errors

    # ------------------------------------------------------------------ saves

    @property
    def open_saves(self) -> int:
        """Requests with chunks submitted for saving and no commit yet."""
        return self._saves.open_saves

    @property
    def saved_tokens(self) -> int:
        """Tokens the daemon added at this worker's commits."""
        return self._saves.saved_tokens

    @property
    def save_s(self) -> float:
        """Time spent saving (in the background)."""
        return self._saves.save_s

    @property
    def save_failures(self) -> int:
        """Saves the daemon refused or failed (the request was not cached)."""
        return self._saves.failures

    def before_forward(self, meta: TierCacheMetadata) -> None:
        """Before the forward pass may write the blocks of preempted requests: finish their copies."""
        if meta.preempted:
            self._saves.fence(meta.preempted)

    def wait_for_save(self, meta: TierCacheMetadata) -> None:
        """Hand the chunks this forward pass completed to the background saves (:mod:`.saves`)."""
        if meta.saves:  # even when disabled: the queue owes vLLM the held requests back
            self._saves.submit(meta.saves)

    def get_finished(self, finished_req_ids: set[str]) -> set[str]:
        """Finished requests held for a save whose copies and commit are done (vLLM frees their blocks)."""
        return self._saves.finished(finished_req_ids)

    def shutdown(self) -> None:
        """Finish the loads and the saves (open reservations are dropped)."""
        if self._connecting is not None:
            self._connecting.join()
        self._finish_loads()
        self._saves.close()

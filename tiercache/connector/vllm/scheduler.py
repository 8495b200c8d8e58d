"""The scheduler-side connector (in vLLM's EngineCore): one lookup per request, and each step's plan.

* At start the engine's namespace is registered in the background (:mod:`.ahead`).
* ``get_num_new_matched_tokens`` asks the daemon once per request (a lookup that also starts promoting the
  prefix into shared memory) how many of the prompt's full chunks it holds, and offers vLLM the cached
  tokens beyond what vLLM has locally, in whole blocks — the last cached chunk may be loaded in part, and
  never the whole prompt (vLLM computes at least the last token).
  A daemon that is down or fails is a miss (logged and counted), never an exception.
* ``update_state_after_alloc`` records which tokens the worker loads; ``build_connector_meta`` turns that
  and the step's block tables into a :class:`~.metadata.TierCacheMetadata`: the blocks to load, and the
  full chunks of each prompt completed by this step, to be copied into one store reservation per request,
  committed in the step that completes the prompt's last full chunk.
* The worker copies and commits in the background (:mod:`.saves`), so ``request_finished`` returns True
  for a request that had save work: vLLM holds its blocks until the worker's ``get_finished`` reports the
  request (its copies done, its reservation committed — or dropped, when the request ended before its last
  full chunk: an aborted request publishes nothing). A preempted request with save work is named in the
  next step's ``preempted``: the worker finishes its copies before vLLM's next forward pass reuses the
  blocks, and drops its reservation.

Primitives:
    SchedulerSide: get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta,
        request_finished, shutdown; ``lookup_failures`` counts daemon failures.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tiercache.errors import TierCacheError
from tiercache.keys import chunk_keys

from ..client import TierCacheClient
from .ahead import connect_ahead
from .metadata import LoadSpec, SaveSpec, TierCacheMetadata
from .namespace import EngineIdentity, request_factors

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    """What the scheduler side tracks of one request."""

    request: Any
    adapter: str
    salt: str
    full_chunks: int
    cached_chunks: int
    loadable_tokens: int
    pending_load: tuple[int, int] | None = None
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0
    save_open: bool = False
    save_done: bool = False


class SchedulerSide:
    """The scheduler role of :class:`~tiercache.connector.vllm.TierCacheConnector`."""

    def __init__(self, identity: EngineIdentity, client: TierCacheClient) -> None:
        self._identity = identity
        self._client = client
        self._chunk = identity.layout.chunk_tokens
        self._block = identity.layout.page_tokens
        self._requests: dict[str, _Request] = {}
        self.lookup_failures = 0
        self._connecting = connect_ahead(client, identity.namespace(), map_segment=False)

    def shutdown(self) -> None:
        """Wait for the registration made at start (before the client is closed)."""
        self._connecting.join()

    # ------------------------------------------------------------------ lookups

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Cached tokens beyond ``num_computed_tokens`` the worker can load (synchronously: False)."""
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            tracked = self._lookup(request)
            self._requests[request.request_id] = tracked
        return max(0, tracked.loadable_tokens - num_computed_tokens), False

    def _lookup(self, request: Any) -> _Request:
        prompt = list(request.prompt_token_ids or ())
        adapter, salt = request_factors(request)
        full = len(prompt) // self._chunk
        cached = 0
        if full:
            ns = self._identity.namespace(adapter, salt)
            try:
                cached = self._client.lookup(
                    ns, chunk_keys(ns, prompt[: full * self._chunk]), prefetch=True
                ).chunks
            except TierCacheError as exc:
                self.lookup_failures += 1
                logger.warning("tiercache lookup failed (%s); request %s recomputes", exc, request.request_id)
        # Whole blocks of the cached chunks (the last chunk may be loaded in part), never the last token.
        loadable = min(cached * self._chunk, (len(prompt) - 1) // self._block * self._block)
        return _Request(request, adapter, salt, full, cached, max(0, loadable))

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Remember the tokens ``[end - num_external_tokens, end)`` for the worker to load."""
        tracked = self._requests.get(request.request_id)
        if tracked is None or num_external_tokens <= 0:
            return
        end = tracked.loadable_tokens
        tracked.pending_load = (end - num_external_tokens, end)

    # ------------------------------------------------------------------ per-step plan

    def build_connector_meta(self, so: Any) -> TierCacheMetadata:
        """The step's loads, saves and dropped reservations (see the module docstring)."""
        meta = TierCacheMetadata()
        for req_id in so.preempted_req_ids or ():
            self._preempted(req_id, meta)
        for new in so.scheduled_new_reqs:
            tracked = self._requests.get(new.req_id)
            if tracked is not None:
                tracked.block_ids = list(new.block_ids[0])
                self._plan(new.req_id, tracked, new.num_computed_tokens, so.num_scheduled_tokens, meta)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._requests.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks is not None:
                tracked.block_ids.extend(new_blocks[0])
            self._plan(req_id, tracked, cached.num_computed_tokens[i], so.num_scheduled_tokens, meta)
        return meta

    def _plan(
        self,
        req_id: str,
        tracked: _Request,
        num_computed: int,
        num_scheduled: dict[str, int],
        meta: TierCacheMetadata,
    ) -> None:
        prompt = tracked.request.prompt_token_ids or ()
        if tracked.pending_load is not None:
            first, end = tracked.pending_load
            tracked.pending_load = None
            meta.loads.append(
                LoadSpec(
                    req_id,
                    tracked.adapter,
                    tracked.salt,
                    tuple(prompt[: -(-end // self._chunk) * self._chunk]),
                    tuple(tracked.block_ids[: end // self._block]),
                    first // self._block,
                )
            )
        if tracked.save_done or tracked.full_chunks <= tracked.cached_chunks:
            return
        done = min((num_computed + num_scheduled.get(req_id, 0)) // self._chunk, tracked.full_chunks)
        start = tracked.cached_chunks
        positions = tuple(range(max(tracked.saved_upto, start), done))
        if not positions:
            return
        commit = done >= tracked.full_chunks
        meta.saves.append(
            SaveSpec(
                req_id,
                tracked.adapter,
                tracked.salt,
                () if tracked.save_open else tuple(prompt[: tracked.full_chunks * self._chunk]),
                start,
                positions,
                tuple(tracked.block_ids[: done * self._chunk // self._block]),
                commit,
            )
        )
        tracked.save_open, tracked.saved_upto, tracked.save_done = True, done, commit

    def _preempted(self, req_id: str, meta: TierCacheMetadata) -> None:
        """A preempted request loses its blocks: fence its copies and look it up again when resumed."""
        tracked = self._requests.pop(req_id, None)
        if tracked is not None and tracked.save_open:
            meta.preempted.append(req_id)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; hold its blocks (True) when it had save work, until the worker reports it."""
        tracked = self._requests.pop(request.request_id, None)
        return tracked is not None and tracked.save_open, None

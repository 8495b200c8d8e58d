"""The scheduler-side connector (in vLLM's EngineCore): at most one daemon call per request, each step's plan.

* At start the engine's namespace is registered in the background (:mod:`.ahead`).
* ``get_num_new_matched_tokens`` asks the daemon at most once per request how many of the prompt's full
  chunks it holds, and offers vLLM the cached tokens beyond what vLLM has locally, in whole blocks — the last
  cached chunk may be loaded in part, and never the whole prompt (vLLM computes at least the last token).
  No call at all when tiercache cannot add a block: the prompt is shorter than a loadable chunk, vLLM's own
  prefix cache (``num_computed_tokens``) already covers every block tiercache could offer, or the request
  said ``tiercache_skip_load`` (:mod:`.params`) or skips reading caches (vLLM's
  ``skip_reading_prefix_cache``, e.g. for prompt logprobs). The call asks only for the chunks from the one
  holding vLLM's first uncomputed token on (keys are a hash chain: a chunk's key names its whole prefix).
  Nor when the pool's published L2 index (:mod:`tiercache.tiers.published`, ``published_index``) holds that
  chunk: the answer is the run of chunks it holds from there, the worker copies the slots it names and then
  checks their entries held (no lease; a chunk dropped meanwhile is a load error, vLLM recomputes it).
  One call serves a scheduler step: the request vLLM asks about is looked up together with the requests
  that arrived with it (``on_new_request``; up to :data:`BATCH_MAX`), each from the chunks vLLM's own prefix
  cache does not hold of it (``bind_local_hit``) nor an earlier request of the batch brings — one
  AcquireLoad carrying a chain per request (``more_chains``), each under its own lease — so vLLM's later
  questions in the step are answered without a call, and no request waits a step for its answer.
  The call runs in the background (``tiercache-ask`` threads, a few batches at once): while other requests
  run (the last step scheduled some), vLLM's scheduler waits at most :data:`ASK_WAIT_S` for it and
  otherwise answers None (vLLM skips the request and asks again next step: ``late_answers``), so a slow
  daemon delays only the requests it is asked about, never the running ones; with nothing else to run it
  waits for the answer. After a run of answers that brought nothing (:class:`~.asking.Outlook`) a busy step
  does not wait: a request whose answer is not there computes its prompt (unless it asks about a chunk this
  engine saved: a follow-up turn). An answer that comes after vLLM dropped its request, or after the
  request went on without it, has its lease released.
  With TP = PP = 1 that one call is AcquireLoad (under the configured load policy): it looks the chunks up,
  promotes them into shared memory and leases their slots, and the lease travels to the worker in the
  step's :class:`~.metadata.LoadSpec` (its slots numbered by chunk position in the prompt) — the worker only
  copies, and releases it (the daemon ties a lease to the namespace's handle, which the worker's connection
  registers too), so a loaded request costs one round trip. A request that vLLM asked about but could not
  schedule (no free blocks) keeps its answer and its lease for its retries while the lease is young
  (:data:`HOLD_FRACTION` of its TTL): a request waiting for blocks is not looked up and leased again at
  every step. A lease the worker never gets is released here (deferred: on the namespace's next call, or
  one-way shortly after) when vLLM allocates no external tokens, when a waiting request's lease grows old,
  when it is preempted before its load, and when it finishes.
  With TP or PP > 1 (each worker leases its own shard: :mod:`.worker`) or the byte stream (``data_plane``
  ``stream``, or ``auto`` when the daemon names no segment: the worker streams) the call is a Lookup that
  starts promoting the prefix. Under ``auto`` a worker that cannot map the segment releases and streams.
  A daemon that is down or fails is a miss (logged and counted), never an exception.
* ``update_state_after_alloc`` records which tokens the worker loads; ``build_connector_meta`` turns that
  and the step's block tables into a :class:`~.metadata.TierCacheMetadata`: the blocks to load, and the
  full chunks of each prompt completed by this step (from the first chunk neither vLLM nor tiercache had
  when it was looked up; none under ``tiercache_skip_save``), to be copied into one store reservation per
  request, committed in the step that completes the prompt's last full chunk.
* The worker copies and commits in the background (:mod:`.saves`), so ``request_finished`` returns True
  for a request that had save work: vLLM holds its blocks until the worker's ``get_finished`` reports the
  request (its copies done, its reservation committed — or dropped, when the request ended before its last
  full chunk: an aborted request publishes nothing). A preempted request with save work is named in the
  next step's ``preempted``: the worker finishes its copies before vLLM's next forward pass reuses the
  blocks, and drops its reservation.

Primitives:
    HOLD_FRACTION: how much of its TTL a waiting request's lease is kept for its retries.
    BATCH_MAX: the most requests looked up in one call.
    ASK_WAIT_S: how long a step waits for a late answer while other requests run.
    SchedulerSide: get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta,
        request_finished, shutdown; ``lookup_failures`` counts daemon failures, ``lookups`` the daemon calls
        made (one per namespace of a batch), ``unawaited`` the requests that went on without their answer,
        ``held_leases`` the leases taken and not yet handed to the worker or released.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace, chunk_keys

from ..client import TierCacheClient
from ..results import LoadLease
from .ahead import connect_ahead
from .asking import Asker, Outlook, Question
from .config import VllmConnectorConfig
from .loads import leased_prefix, published_lease
from .metadata import LoadSpec, SaveSpec, TierCacheMetadata
from .namespace import EngineIdentity, request_factors
from .params import request_params
from .tracking import Ask, Call, Tracked

logger = logging.getLogger(__name__)

HOLD_FRACTION = 0.5
"""A request vLLM could not schedule keeps its answer and lease for retries while younger than this of its TTL."""
BATCH_MAX = 32
"""Most requests looked up in one daemon call: the one vLLM asks about and those that arrived with it."""
ANSWER_FRESH_S = 1.0
"""A retried request's answer without a lease (a miss, or a Lookup's) is reused for this long."""
ASK_WAIT_S = 0.002
"""While other requests run, how long a step waits for an answer before it goes on without the request (a
share of a recent step, up to 25 ms, took docqa's TTFT p50 under vllm serve from 168 to 106 ms, and the
two-engine throughput line of ``tiercache-bench vllm`` from 1.5x plain's requests/s to 0.44x: there the
answers came late and every wait held the whole engine). Not kept: one bound for all of a step's requests
(tiercache_l3 outgrowing, c=8: 1.4-2.6x the steps skipped for a late answer, req/s -3 % to +4 %: noise)."""


class SchedulerSide:
    """The scheduler role of :class:`~tiercache.connector.vllm.TierCacheConnector`."""

    def __init__(
        self,
        identity: EngineIdentity,
        client: TierCacheClient,
        config: VllmConnectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._identity = identity
        self._client = client
        self._config = config
        self._clock = clock
        self._chunk = identity.layout.chunk_tokens
        self._chunk_bytes = identity.layout.chunk_bytes
        self._block = identity.layout.page_tokens
        self._lease_here = identity.tp_size == 1 and identity.pp_size == 1
        self._requests: dict[str, Tracked] = {}
        self._waiting: set[str] = set()  # leased for, and not allocated (yet)
        self._arrived: dict[str, Any] = {}  # received by vLLM, not asked about yet (in order)
        self._local_hit: Callable[[Any], int] | None = None
        self._asking: dict[str, Call] = {}  # asked about, the answer not taken yet
        self._calls: list[Call] = []  # in flight, answers not taken (some of their requests may be gone)
        self._busy = False  # the last step ran requests: a request whose answer is late waits a step
        self._asker = Asker(client, config, self._lease_here)
        self._outlook = Outlook()
        self.late_answers = 0  # requests skipped for a step: their answer came after the step's wait
        self.ask_wait_s = 0.0  # time vLLM's scheduler waited for answers
        self.unawaited = 0  # requests that went on without their answer (a miss was expected)
        self.lookup_failures = 0
        self.lookups = 0
        self.index_answers = 0  # requests answered from the published index, with no call
        self.lookup_misses = 0  # requests asked about of which the daemon held nothing more
        self.lookup_hit_tokens = 0  # tokens offered to vLLM from the daemon's answers
        self._connecting = connect_ahead(
            client,
            identity.namespace(),
            map_segment=False,
            prefill=config.prefill if self._lease_here else None,
        )

    @property
    def held_leases(self) -> int:
        """Leases taken for requests and neither handed to the worker nor released yet."""
        return sum(1 for t in self._requests.values() if t.lease is not None)

    def shutdown(self) -> None:
        """Release the leases still held; wait for the registration made at start (before the client is
        closed, which sends the deferred releases)."""
        for call in list(self._calls):
            concurrent.futures.wait([call.future])
            self._apply(call)
        self._asker.shutdown()
        for tracked in self._requests.values():
            self._release(tracked)
        self._connecting.join()

    # ------------------------------------------------------------------ lookups

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Cached tokens beyond ``num_computed_tokens`` the worker can load (synchronously: False); None
        while the daemon's answer is late and other requests run (vLLM asks again next step)."""
        req_id = request.request_id
        self._collect()
        tracked = self._requests.get(req_id)
        if tracked is not None and not self._answers(tracked, num_computed_tokens):
            self._forget(req_id)
            tracked = None
        if tracked is None:
            call = self._asking.get(req_id)
            if call is None:
                self._arrived.pop(req_id, None)
                call = self._lookup([(request, num_computed_tokens), *self._take_arrived()])
            # (a request not in its batch's call has all its blocks brought by it: nothing to wait for)
            if call is not None and (ask := self._ask_of(call, req_id)) is not None:
                hopeful = self._outlook.hopeful(ask.keys[ask.first])
                if not self._wait(call, hopeful):
                    if hopeful:
                        self.late_answers += 1
                        return None, False
                    self._go_on(req_id, ask)
            tracked = self._requests[req_id]
        return max(0, tracked.loadable_tokens - num_computed_tokens), False

    def bind_local_hit(self, local_hit: Callable[[Any], int]) -> None:
        """How many tokens of a request vLLM's own prefix cache holds (for the requests looked up ahead)."""
        self._local_hit = local_hit

    def on_new_request(self, request: Any) -> None:
        """Note a request vLLM just received: it is looked up with the next request vLLM asks about."""
        self._arrived[request.request_id] = request

    def _take_arrived(self) -> list[tuple[Any, int]]:
        """The requests arrived and not asked about (up to :data:`BATCH_MAX`), with vLLM's tokens of each."""
        taken: list[tuple[Any, int]] = []
        while self._arrived and len(taken) < BATCH_MAX - 1:
            req_id = next(iter(self._arrived))
            request = self._arrived.pop(req_id)
            if req_id not in self._requests:
                local = self._local_hit(request) if self._local_hit is not None else 0
                taken.append((request, local - local % self._block))
        return taken

    def _answers(self, tracked: Tracked, num_computed: int) -> bool:
        """Whether a retried request's answer holds: it covers what vLLM lacks now, and its lease is young."""
        if tracked.asked_from < 0 or num_computed // self._chunk < tracked.asked_from:
            return False  # deciding again costs no call, or vLLM lost blocks it had
        if tracked.published:  # given once (looked up ahead); a retry looks again (it costs no call)
            offered, tracked.offered = tracked.offered, True
            return not offered
        return self._young(tracked)

    def _young(self, tracked: Tracked) -> bool:
        """Whether the request's answer (and lease) is young enough to be used again."""
        fresh_s = ANSWER_FRESH_S if tracked.lease is None else HOLD_FRACTION * tracked.lease.expires_in_s
        return self._clock() < tracked.asked_at + fresh_s

    def _lookup(self, batch: list[tuple[Any, int]]) -> Call | None:
        """Look requests up (each with the tokens vLLM has of it): one daemon call per namespace, made in
        the ask thread (None: no request needs one). A request without a call is tracked at once; the
        others once their answer is taken (:meth:`_apply`).

        A chunk an earlier request of the batch asks about counts as vLLM's for the later ones: vLLM
        schedules in order, and caches the earlier request's blocks when it allocates them (a later request
        that finds fewer is asked about again: :meth:`_answers`).
        """
        calls: dict[Namespace, list[Ask]] = {}
        seen: dict[Namespace, set[bytes]] = {}
        for request, num_computed in batch:
            tracked, ask = self._decide(request, num_computed)
            if ask is not None:
                asked = seen.setdefault(ask.namespace, set())
                while ask.first < tracked.full_chunks and ask.keys[ask.first] in asked:
                    ask.first += 1
                tracked.cached_chunks = ask.first
                if ask.first * self._chunk < ask.most:
                    asked.update(ask.keys[ask.first :])
                    if not self._from_index(ask):
                        calls.setdefault(ask.namespace, []).append(ask)
                        continue
                # (else the batch's earlier requests bring every block: decided again when asked)
            self._requests[request.request_id] = tracked
        if not calls:
            return None
        now = self._clock()
        for ns, asks in calls.items():
            self.lookups += 1
            for ask in asks:
                ask.tracked.asked_from, ask.tracked.asked_at, ask.tracked.namespace = ask.first, now, ns
        questions: dict[Namespace, list[Question]] = {
            ns: [(ask.keys, ask.first) for ask in asks] for ns, asks in calls.items()
        }
        call = Call(calls, self._asker.submit(questions))
        self._calls.append(call)
        for asks in calls.values():
            for ask in asks:
                self._asking[ask.tracked.request.request_id] = call
        return call

    def _from_index(self, ask: Ask) -> bool:
        """Answer a request from its pool's published index, with no call, when the index holds the first
        chunk vLLM lacks (and every one after it that it holds, in order); False: ask the daemon."""
        tracked = ask.tracked
        segment, found = self._asker.published(ask.namespace, ask.keys[ask.first :], self._chunk_bytes)
        loadable = min((ask.first + len(found)) * self._chunk, ask.most)
        if not found or loadable <= ask.num_computed:
            return False
        tracked.cached_chunks, tracked.loadable_tokens = ask.first + len(found), loadable
        tracked.published, tracked.segment = tuple(found), segment
        tracked.asked_from, tracked.asked_at, tracked.namespace = ask.first, self._clock(), ask.namespace
        self._outlook.note(True)
        self.index_answers += 1
        self.lookup_hit_tokens += loadable - ask.num_computed
        return True

    def _wait(self, call: Call, hopeful: bool) -> bool:
        """Take ``call``'s answer if it comes in time (at once when not hopeful); False when it is late."""
        wait_s = (ASK_WAIT_S if hopeful else 0.0) if self._busy else None
        started = time.perf_counter()
        done, _ = concurrent.futures.wait([call.future], timeout=wait_s)
        self.ask_wait_s += time.perf_counter() - started
        if not done:
            return False
        self._apply(call)
        return True

    @staticmethod
    def _ask_of(call: Call, req_id: str) -> Ask | None:
        return next(
            (a for asks in call.asks.values() for a in asks if a.tracked.request.request_id == req_id), None
        )

    def _go_on(self, req_id: str, ask: Ask) -> None:
        """Track a request as a miss without its answer (which, when it comes, is only noted and released)."""
        del self._asking[req_id]
        self._requests[req_id] = replace(ask.tracked, lease=None, loadable_tokens=0, block_ids=[])
        self.unawaited += 1

    def _collect(self) -> None:
        """Take the answers that came (leases tracked, or released when the request is gone)."""
        for call in [c for c in self._calls if c.future.done()]:
            self._apply(call)

    def _decide(self, request: Any, num_computed: int) -> tuple[Tracked, Ask | None]:
        """A request's tracking, and what to ask the daemon about it (None: no call can add a block)."""
        prompt = list(request.prompt_token_ids or ())
        adapter, salt = request_factors(request)
        params = request_params(request)
        full = len(prompt) // self._chunk
        first = min(num_computed // self._chunk, full)  # vLLM has the chunks before this one
        tracked = Tracked(request, adapter, salt, params, full, first, save_done=not params.save)
        # Whole blocks of cached chunks (the last one may be loaded in part), never the last token.
        most = min(full * self._chunk, (len(prompt) - 1) // self._block * self._block)
        if not params.load or most <= num_computed or getattr(request, "skip_reading_prefix_cache", False):
            return tracked, None  # tiercache cannot add a block (or vLLM would not take it)
        ns = self._identity.namespace(adapter, salt)
        tracked.keys = keys = chunk_keys(ns, prompt[: full * self._chunk])
        return tracked, Ask(tracked, ns, keys, first, most, num_computed)

    def _apply(self, call: Call) -> None:
        """Take a call's answers: each request's lease or cached chunks (a failed call is a miss)."""
        if call not in self._calls:
            return  # taken already
        self._calls.remove(call)
        try:
            answers = call.future.result()
        except Exception as exc:  # a bug in the ask thread must not reach vLLM: every request recomputes
            logger.exception("tiercache lookup failed")
            answers = {ns: TierCacheError(str(exc)) for ns in call.asks}
        for ns, asks in call.asks.items():
            answer = answers[ns]
            if isinstance(answer, TierCacheError):
                self.lookup_failures += 1
                logger.warning("tiercache lookup failed (%s); %d requests recompute", answer, len(asks))
            else:
                for ask, got in zip(asks, answer, strict=False):
                    if isinstance(got, LoadLease):
                        self._take(ask, got)
                    elif isinstance(got, int):
                        ask.tracked.cached_chunks = got
            for ask in asks:
                self._answered(ask, call)

    def _answered(self, ask: Ask, call: Call) -> None:
        """Track a request with its answer (or release its lease, when vLLM forgot it meanwhile)."""
        tracked = ask.tracked
        tracked.loadable_tokens = max(0, min(tracked.cached_chunks * self._chunk, ask.most))
        hit = max(0, tracked.loadable_tokens - ask.num_computed)  # (for vLLM's stats: .stats)
        self._outlook.note(hit > 0)
        req_id = tracked.request.request_id
        wanted = self._asking.get(req_id) is call  # (vLLM neither dropped the request nor went on)
        self.lookup_hit_tokens += hit if wanted else 0
        self.lookup_misses += int(hit == 0)
        if not wanted or tracked.loadable_tokens <= ask.num_computed:
            self._release(tracked)
        if wanted:
            del self._asking[req_id]
            self._requests[req_id] = tracked
            if tracked.lease is not None:
                self._waiting.add(req_id)

    def _take(self, ask: Ask, lease: LoadLease) -> None:
        """Keep a request's lease, its slots renumbered by chunk position in the prompt."""
        if ask.first:
            lease = replace(lease, slots=tuple(replace(r, index=r.index + ask.first) for r in lease.slots))
        if lease.lease_id:
            ask.tracked.lease = lease
        ask.tracked.cached_chunks = ask.first + len(leased_prefix(lease, self._identity.layout.chunk_bytes))

    def _release(self, tracked: Tracked) -> None:
        """Release the request's lease, if it still holds one (deferred: nothing was copied from it)."""
        lease, tracked.lease = tracked.lease, None
        if lease is not None and tracked.namespace is not None:
            self._client.defer_release(tracked.namespace, lease.lease_id)

    def _forget(self, req_id: str) -> Tracked | None:
        """Stop tracking a request (releasing its lease)."""
        self._waiting.discard(req_id)
        self._asking.pop(req_id, None)  # an answer still to come is released when it comes
        tracked = self._requests.pop(req_id, None)
        if tracked is not None:
            self._release(tracked)
        return tracked

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Remember the tokens ``[end - num_external_tokens, end)`` for the worker to load."""
        self._waiting.discard(request.request_id)
        tracked = self._requests.get(request.request_id)
        if tracked is None:
            return
        if num_external_tokens <= 0:
            self._release(tracked)  # vLLM has every loadable token itself
            return
        end = tracked.loadable_tokens
        tracked.pending_load = (end - num_external_tokens, end)

    # ------------------------------------------------------------------ per-step plan

    def build_connector_meta(self, so: Any) -> TierCacheMetadata:
        """The step's loads, saves and dropped reservations (see the module docstring)."""
        meta = TierCacheMetadata()
        self._collect()
        self._busy = any(so.num_scheduled_tokens.values())
        for req_id in list(self._waiting):  # leased for, not scheduled: kept for its retries while young
            waiting = self._requests.get(req_id)
            if waiting is None or waiting.lease is None or not self._young(waiting):
                self._forget(req_id)
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
        tracked: Tracked,
        num_computed: int,
        num_scheduled: dict[str, int],
        meta: TierCacheMetadata,
    ) -> None:
        prompt = tracked.request.prompt_token_ids or ()
        if tracked.pending_load is not None:
            first, end = tracked.pending_load
            tracked.pending_load = None
            lease = (
                published_lease(tracked.asked_from, tracked.published) if tracked.published else tracked.lease
            )
            meta.loads.append(
                LoadSpec(
                    req_id,
                    tracked.adapter,
                    tracked.salt,
                    tuple(prompt[: -(-end // self._chunk) * self._chunk]),
                    tuple(tracked.block_ids[: end // self._block]),
                    first // self._block,
                    lease,
                    tracked.asked_at,
                    tracked.published,
                    tracked.segment,
                )
            )
            tracked.lease, tracked.published = (
                None,
                (),
            )  # the worker's now: it releases the lease after its copy
        if tracked.save_done or tracked.full_chunks <= tracked.cached_chunks:
            return
        done = min((num_computed + num_scheduled.get(req_id, 0)) // self._chunk, tracked.full_chunks)
        start = tracked.cached_chunks
        positions = tuple(range(max(tracked.saved_upto, start), done))
        if not positions:
            return
        commit = done >= tracked.full_chunks
        if tracked.keys is None:
            ns = self._identity.namespace(tracked.adapter, tracked.salt)
            tracked.keys = chunk_keys(ns, list(prompt[: tracked.full_chunks * self._chunk]))
        self._outlook.saved(tracked.keys[p] for p in positions)
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
        tracked = self._forget(req_id)  # (its lease, when preempted before its load was planned)
        if tracked is not None and tracked.save_open:
            meta.preempted.append(req_id)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request; hold its blocks (True) when it had save work, until the worker reports it."""
        self._arrived.pop(request.request_id, None)
        tracked = self._forget(request.request_id)
        return (tracked is not None and tracked.save_open), None

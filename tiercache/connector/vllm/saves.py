"""The worker's saves: reserve, copy out of vLLM's blocks and commit, off the engine's critical path.

After each forward pass the worker hands :class:`SaveQueue` the step's save work (:class:`~.metadata.SaveSpec`: which
full chunks of which requests are complete, in which blocks). One background thread runs the work of every
request in submission order: at a request's first work it reserves room through the namespace's data plane
(a :class:`~tiercache.connector.layerwise.LayerwiseSave`: one BeginStore for shared-memory slots, or local
buffers for the byte stream; nothing is visible yet), copies every layer of the new chunks out of vLLM's
blocks into it (``save_chunks``), and after the work that completes the prompt's last full chunk it commits
the reservation (CommitStore, or one StreamStore that the daemon commits when the stream ends) — only if
every reserved chunk was copied, so a request publishes all of its chunks or none.

Wrong KV stays impossible because a block is only read while vLLM cannot reuse it:

* a running request keeps its blocks;
* a finished request that had save work is held by vLLM (the scheduler side's ``request_finished`` returns
  True) until :meth:`SaveQueue.finished` reports it, which happens only once its work is done;
* a preempted request loses its blocks at once: :meth:`SaveQueue.fence` runs before the next forward pass
  (which may write them) and waits for that request's copies, then drops its open reservation.

A finished request whose reservation is still open (aborted before its last chunk) has it dropped; its slots
are never published. Daemon trouble is logged and counted (``failures``), never raised into vLLM.

The thread is started on demand and exits when the queue has been empty for :data:`SAVE_IDLE_S` (or at
``close``); it is not a daemon thread, so a process that exits right after a request (a test or bench engine)
still finishes its commits first. It runs at the engine's own CPU priority. It used to run at nice +10,
where it may hold the GIL through its control-socket calls while the OS runs the busy-polling engine before
it, so that the worker's model thread waits for the GIL. The measurements do not separate the two
(``vllm serve``, working set fits, tiercache_l2 against plain vLLM in the same invocation): chat at
concurrency 1, 0.91x / 0.94x req/s at +10 against 1.07x / 1.04x at 0; at concurrency 8, chat 0.86x /
1.02x against 0.88x / 0.92x and system 0.80x / 0.95x (both in slow phases of the host) against 0.95x /
0.96x. The simpler code stays. Holding a step's work until the next step began (off the way of the
step's tokens to the user) was measured too and not kept: chat fitting at concurrency 1 went from 0.88x
to 0.93x plain's requests/s (spreads overlapping; 0.94x without it the day before), and outgrowing at
concurrency 8 tiercache_l2 went from 0.94x / 0.95x / 1.01x the ideal's to 0.89x / 0.86x / 0.90x (system,
chat, docqa; system's spreads apart).

Primitives:
    SAVE_IDLE_S: how long the save thread waits for work before it exits.
    SaveQueue: submit, fence, finished, close; ``open_saves`` and ``failures``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from tiercache.errors import ConflictError, TierCacheError
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout

from ..client import TierCacheClient
from ..dataplane import DataPlane
from ..kv import PagedKV
from ..layerwise import LayerwiseSave
from .metadata import SaveSpec
from .namespace import EngineIdentity

logger = logging.getLogger(__name__)

SAVE_IDLE_S = 2.0
"""How long the save thread waits for more work before it exits: starting a thread makes the engine's
thread wait until the new one runs, which on a busy host is a scheduler tick or more, once per request."""


class SaveQueue:
    """Runs the worker's save work in a background thread (see the module docstring)."""

    def __init__(
        self,
        client: TierCacheClient,
        identity: EngineIdentity,
        caches: Callable[[], Sequence[torch.Tensor]],
        plane: Callable[[Namespace], DataPlane],
    ) -> None:
        """Args:
        client: the daemon client (thread-safe).
        identity: the engine's identity (namespaces and layout).
        caches: the registered caches, per layer as ``[planes, num_blocks, plane_block_bytes]`` bytes.
        plane: a namespace's data plane (shared memory or byte stream; may raise TierCacheError).
        """
        self._client = client
        self._identity = identity
        self._layout: KVLayout = identity.layout
        self._caches = caches
        self._plane = plane
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[str, Callable[[], None]]] = collections.deque()
        self._pending: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._reservations: dict[str, LayerwiseSave] = {}  # the background thread's
        self._owed: set[str] = set()  # requests with work: vLLM holds them when they finish
        self._reporting: set[str] = set()  # finished, reported once their work is done
        self._uncommitted: set[str] = set()
        self.failures = 0
        self.saved_tokens = 0  # tokens the daemon added at commits (for vLLM's stats: .stats)
        self.save_s = 0.0  # time the background thread spent reserving, copying and committing

    @property
    def open_saves(self) -> int:
        """Requests with save work submitted and no commit yet."""
        return len(self._uncommitted)

    # ------------------------------------------------------------------ engine thread

    def submit(self, works: Iterable[SaveSpec]) -> None:
        """Queue a forward pass's save work (call after the pass, the blocks hold the KV)."""
        event = None
        for work in works:
            if event is None and self._on_cuda():
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record(torch.cuda.current_stream(self._caches()[0].device))
            self._owed.add(work.req_id)
            if work.commit:
                self._uncommitted.discard(work.req_id)
            else:
                self._uncommitted.add(work.req_id)
            self._post(work.req_id, functools.partial(self._save, work, event))

    def fence(self, req_ids: Iterable[str]) -> None:
        """Before a forward pass: wait for the copies of preempted requests, drop their open reservations."""
        fenced = [r for r in req_ids if r in self._owed]
        for req_id in fenced:
            self._owed.discard(req_id)
            self._uncommitted.discard(req_id)
            self._post(req_id, functools.partial(self._drop, req_id))
        with self._cond:
            self._cond.wait_for(lambda: not any(self._pending[r] for r in fenced))

    def finished(self, finished_req_ids: Iterable[str]) -> set[str]:
        """Note the requests vLLM finished; return those held for a save whose work is now done."""
        for req_id in finished_req_ids:
            if req_id in self._owed:
                self._owed.discard(req_id)
                self._uncommitted.discard(req_id)
                self._reporting.add(req_id)
                self._post(req_id, functools.partial(self._drop, req_id))  # an aborted request's open ticket
        with self._cond:
            done = {r for r in self._reporting if not self._pending[r]}
        self._reporting -= done
        return done

    def close(self) -> None:
        """Drop every open reservation and wait for the thread to finish its work."""
        for req_id in list(self._owed):
            self._post(req_id, functools.partial(self._drop, req_id))
        self._owed.clear()
        self._uncommitted.clear()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._jobs and self._thread is None)

    def _on_cuda(self) -> bool:
        caches = self._caches()
        return bool(caches) and caches[0].device.type == "cuda"

    def _post(self, req_id: str, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append((req_id, job))
            self._pending[req_id] += 1
            self._cond.notify_all()  # the thread may be waiting for work
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tiercache-vllm-save")
                self._thread.start()

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._closing:
                    self._cond.wait_for(lambda: bool(self._jobs) or self._closing, timeout=SAVE_IDLE_S)
                if not self._jobs:
                    self._thread = None
                    self._cond.notify_all()
                    return
                req_id, job = self._jobs.popleft()
            try:
                with torch.inference_mode():  # slot views made in vLLM's forward pass are inference tensors
                    job()
            except Exception:  # a bug must not stop the queue: the request is not cached
                logger.exception("tiercache save of request %s failed; not caching", req_id)
                self._drop(req_id)
            finally:
                with self._cond:
                    self._pending[req_id] -= 1
                    if not self._pending[req_id]:
                        del self._pending[req_id]
                    self._cond.notify_all()

    def _save(self, work: SaveSpec, event: torch.cuda.Event | None) -> None:
        started = time.perf_counter()
        try:
            self._save_timed(work, event)
        finally:
            self.save_s += time.perf_counter() - started

    def _save_timed(self, work: SaveSpec, event: torch.cuda.Event | None) -> None:
        if work.tokens and work.req_id not in self._reservations:
            self._reserve(work)
        held = self._reservations.get(work.req_id)
        if held is None:
            return
        try:
            self._copy(work, held, event)
        except TierCacheError as exc:
            logger.warning("tiercache save of request %s failed (%s); not caching", work.req_id, exc)
            self._drop(work.req_id)
            return
        if work.commit:
            del self._reservations[work.req_id]
            self._commit(work.req_id, held)

    def _reserve(self, work: SaveSpec) -> None:
        """Reserve room for chunks ``start_chunk ..`` of the request (invisible until committed)."""
        if not self._caches():
            return
        ns = self._identity.namespace(work.adapter, work.cache_salt)
        keys = chunk_keys(ns, work.tokens)
        if len(keys) <= work.start_chunk:
            return
        try:
            save = self._plane(ns).begin_save(keys, cached=work.start_chunk)
        except TierCacheError as exc:
            self.failures += 1
            logger.warning("tiercache store of request %s failed (%s); not caching", work.req_id, exc)
            return
        if save.open:
            self._reservations[work.req_id] = save
        else:  # nothing to fill: cached meanwhile, or the reserved memory is unreachable
            save.abort()

    def _copy(self, work: SaveSpec, held: LayerwiseSave, event: torch.cuda.Event | None) -> None:
        """Copy every layer of the work's chunks out of vLLM's blocks (finished when this returns)."""
        caches = self._caches()
        device = caches[0].device
        stream = torch.cuda.Stream(device=device) if event is not None else None  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream) if stream else contextlib.nullcontext():
            if stream is not None and event is not None:
                stream.wait_event(event)  # the forward pass wrote the blocks on the engine's stream
            kv = PagedKV.of_blocks(caches, work.block_ids)
            held.save_chunks(kv, work.chunks, non_blocking=stream is not None)
            if stream is not None:
                stream.synchronize()

    def _commit(self, req_id: str, held: LayerwiseSave) -> None:
        try:
            self.saved_tokens += held.commit().tokens_stored
        except ConflictError:
            logger.warning("request %s: a chunk was not copied; not caching", req_id)
            held.abort()
            return
        if held.failed:
            self.failures += 1

    def _drop(self, req_id: str) -> None:
        held = self._reservations.pop(req_id, None)
        if held is not None:
            held.abort()

"""The worker's saves: reserve, copy out of vLLM's blocks and commit, off the engine's critical path.

After each forward pass the worker hands :class:`SaveQueue` the step's save work (:class:`~.metadata.SaveSpec`: which
full chunks of which requests are complete, in which blocks). One background thread runs the work of every
request in submission order: at a request's first work it reserves slots (one BeginStore: nothing is
visible yet), copies every layer of the new chunks out of vLLM's blocks into the slots, and after the work
that completes the prompt's last full chunk it commits the reservation — only if every reserved chunk was
copied, so a request publishes all of its chunks or none.

Wrong KV stays impossible because a block is only read while vLLM cannot reuse it:

* a running request keeps its blocks;
* a finished request that had save work is held by vLLM (the scheduler side's ``request_finished`` returns
  True) until :meth:`SaveQueue.finished` reports it, which happens only once its work is done;
* a preempted request loses its blocks at once: :meth:`SaveQueue.fence` runs before the next forward pass
  (which may write them) and waits for that request's copies, then drops its open reservation.

Over the byte stream (``stream_plane`` gives the namespace's plane) there is nothing to reserve: a request's
chunks are staged in this process's memory as they are copied, and its commit sends them in one StreamStore
(the daemon commits it when the stream ends, so a failed stream leaves nothing visible); a drop frees them.

A finished request whose reservation is still open (aborted before its last chunk) has it dropped; its slots
are never published. Daemon trouble is logged and counted (``failures``), never raised into vLLM.

The thread is started on demand and exits when the queue is empty; it is not a daemon thread, so a process
that exits right after a request (a test or bench engine) still finishes its commits first. It runs at a
lower CPU priority (:data:`SAVE_NICE`): a save is never on a request's path, but on a machine with few
cores its copies and commits otherwise compete with the next request's forward pass.

Primitives:
    SAVE_NICE: how much the save thread lowers its CPU priority (Linux nice increment).
    SaveQueue: submit, fence, finished, close; ``open_saves`` and ``failures``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager

import torch

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout

from ..client import TierCacheClient
from ..kv import PagedKV, kv_to_chunk
from ..results import SlotRef, StoreGrant
from ..segments import SlotMapping
from ..stream_plane import ByteStreamPlane
from .metadata import SaveSpec
from .namespace import EngineIdentity

logger = logging.getLogger(__name__)

SAVE_NICE = 10
"""Nice increment of the save thread (Linux sets it per thread): it yields the CPU to the engine's threads."""


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority by :data:`SAVE_NICE` (where the OS supports it per thread)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + SAVE_NICE)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: saves run at normal priority
        logger.debug("cannot lower the save thread's priority (%s)", exc)


class _Reservation(ABC):
    """Where a request's chunks go while they are copied, until its commit (owned by the background thread).

    Attributes:
        namespace: the request's namespace.
        positions: the chunk positions reserved.
        copied: the positions copied so far.
    """

    def __init__(self, namespace: Namespace, positions: Iterable[int]) -> None:
        self.namespace = namespace
        self.positions = frozenset(positions)
        self.copied: set[int] = set()

    @abstractmethod
    def buffers(self) -> AbstractContextManager[Callable[[int], torch.Tensor]]:
        """Inside: chunk position -> its 1-D uint8 buffer (``chunk_bytes`` long)."""

    @abstractmethod
    def commit(self, client: TierCacheClient) -> None:
        """Publish every chunk (all were copied).

        Raises:
            TierCacheError: the daemon refused or failed it.
        """

    @abstractmethod
    def abort(self, client: TierCacheClient) -> None:
        """Drop the chunks (best effort; never raises)."""


class _Slots(_Reservation):
    """A store ticket: the chunks are copied into the daemon's shared-memory slots."""

    def __init__(self, ns: Namespace, grant: StoreGrant, mapping: SlotMapping, slots: dict[int, SlotRef]):
        super().__init__(ns, slots)
        self.grant = grant
        self.mapping = mapping
        self.slots = slots

    @contextlib.contextmanager
    def buffers(self) -> Iterator[Callable[[int], torch.Tensor]]:
        with self.mapping.use() as access:
            yield lambda pos: access.view(self.slots[pos])

    def commit(self, client: TierCacheClient) -> None:
        client.commit_store(self.namespace, self.grant.ticket_id)

    def abort(self, client: TierCacheClient) -> None:
        _abort_ticket(client, self.namespace, self.grant)


class _Staged(_Reservation):
    """Chunks staged in local memory, sent over the byte stream at the commit."""

    def __init__(self, plane: ByteStreamPlane, keys: Sequence[bytes], start: int) -> None:
        super().__init__(plane.namespace, range(start, start + len(keys)))
        self.plane = plane
        self.keys = keys
        self.start = start
        self.staged: dict[int, torch.Tensor] = {}

    def _buffer(self, pos: int) -> torch.Tensor:
        buf = self.staged.get(pos)
        if buf is None:
            buf = self.staged[pos] = torch.empty(self.plane.namespace.layout.chunk_bytes, dtype=torch.uint8)
        return buf

    def buffers(self) -> AbstractContextManager[Callable[[int], torch.Tensor]]:
        return contextlib.nullcontext(self._buffer)

    def commit(self, client: TierCacheClient) -> None:
        payloads = (self.staged[pos] for pos in range(self.start, self.start + len(self.keys)))
        self.plane.send(self.keys, payloads, start_depth=self.start)
        self.staged.clear()

    def abort(self, client: TierCacheClient) -> None:
        self.staged.clear()


def _abort_ticket(client: TierCacheClient, ns: Namespace, grant: StoreGrant) -> None:
    try:
        client.abort_store(ns, grant.ticket_id)
    except TierCacheError as exc:
        logger.warning("aborting store ticket %d failed (%s); it lapses at its TTL", grant.ticket_id, exc)


class SaveQueue:
    """Runs the worker's save work in a background thread (see the module docstring)."""

    def __init__(
        self,
        client: TierCacheClient,
        identity: EngineIdentity,
        caches: Callable[[], Sequence[torch.Tensor]],
        stream_plane: Callable[[Namespace], ByteStreamPlane | None] = lambda ns: None,
    ) -> None:
        """Args:
        client: the daemon client (thread-safe).
        identity: the engine's identity (namespaces and layout).
        caches: the registered caches, per layer as ``[planes, num_blocks, plane_block_bytes]`` bytes.
        stream_plane: a namespace's byte stream when its chunks are sent that way, else None (shared
            memory); may raise TierCacheError.
        """
        self._client = client
        self._identity = identity
        self._layout: KVLayout = identity.layout
        self._caches = caches
        self._stream_plane = stream_plane
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[str, Callable[[], None]]] = collections.deque()
        self._pending: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._reservations: dict[str, _Reservation] = {}  # the background thread's
        self._owed: set[str] = set()  # requests with work: vLLM holds them when they finish
        self._reporting: set[str] = set()  # finished, reported once their work is done
        self._uncommitted: set[str] = set()
        self.failures = 0

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
            self._cond.wait_for(lambda: not self._jobs and self._thread is None)

    def _on_cuda(self) -> bool:
        caches = self._caches()
        return bool(caches) and caches[0].device.type == "cuda"

    def _post(self, req_id: str, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append((req_id, job))
            self._pending[req_id] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tiercache-vllm-save")
                self._thread.start()

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        _lower_priority()
        while True:
            with self._cond:
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
        """Reserve slots for chunks ``start_chunk ..`` of the request (invisible until committed)."""
        if not self._caches():
            return
        ns = self._identity.namespace(work.adapter, work.cache_salt)
        keys = chunk_keys(ns, work.tokens)[work.start_chunk :]
        if not keys:
            return
        try:
            plane = self._stream_plane(ns)
            if plane is not None:
                self._reservations[work.req_id] = _Staged(plane, keys, work.start_chunk)
                return
            grant = self._client.begin_store(ns, keys, start_depth=work.start_chunk)
            mapping = self._client.slot_mapping(ns)
        except TierCacheError as exc:
            self.failures += 1
            logger.warning("tiercache store of request %s failed (%s); not caching", work.req_id, exc)
            return
        slots = {work.start_chunk + r.index: r for r in grant.slots if r.nbytes == self._layout.chunk_bytes}
        if mapping is None or not grant.slots or len(slots) != len(grant.slots):
            _abort_ticket(self._client, ns, grant)
            return
        self._reservations[work.req_id] = _Slots(ns, grant, mapping, slots)

    def _copy(self, work: SaveSpec, held: _Reservation, event: torch.cuda.Event | None) -> None:
        """Copy every layer of the work's chunks out of vLLM's blocks (finished when this returns)."""
        caches = self._caches()
        positions = [pos for pos in work.chunks if pos in held.positions]
        if not positions:
            return
        device = caches[0].device
        stream = torch.cuda.Stream(device=device) if event is not None else None  # type: ignore[no-untyped-call]
        with held.buffers() as buffer, torch.cuda.stream(stream) if stream else contextlib.nullcontext():
            if stream is not None and event is not None:
                stream.wait_event(event)  # the forward pass wrote the blocks on the engine's stream
            kv = PagedKV.of_blocks(caches, work.block_ids)
            for pos in positions:
                kv_to_chunk(self._layout, kv, pos, buffer(pos), non_blocking=stream is not None)
            if stream is not None:
                stream.synchronize()
        held.copied.update(positions)

    def _commit(self, req_id: str, held: _Reservation) -> None:
        if held.copied != held.positions:
            logger.warning("request %s: a chunk was not copied; not caching", req_id)
            held.abort(self._client)
            return
        try:
            held.commit(self._client)
        except TierCacheError as exc:
            self.failures += 1
            logger.warning("tiercache commit of request %s failed (%s); not caching", req_id, exc)
            held.abort(self._client)

    def _drop(self, req_id: str) -> None:
        held = self._reservations.pop(req_id, None)
        if held is not None:
            held.abort(self._client)

"""Layer-by-layer loads and saves, so that copying layer l + 1 overlaps the engine's compute of layer l.

Chunk bytes are layer-major, so one layer of every chunk of a request can move before the next layer.

Load (:class:`LayerwiseLoad`): a worker thread copies layer 0 of every leased chunk into the engine's
tensors, then layer 1, and so on. On CPU, :meth:`LayerwiseLoad.wait_layer` returns once the worker has
finished layer l. On CUDA the worker issues the copies on a dedicated ``torch.cuda.Stream`` (which first waits
for the engine's stream at the time of the load) and records one ``torch.cuda.Event`` per layer;
``wait_layer(l)`` makes the caller's current stream wait on event l — there is no device-wide synchronize,
and the host only waits until the copies of layer l have been issued. The lease is released by the worker
after the last layer (after waiting for the stream: the slots may be reused once released), or when the
load is closed or fails. The copies are queued without waiting (``non_blocking``: from a pinned segment
they are asynchronous DMA). Every layer's copy is checked to have finished (on CUDA: the stream to have
passed the last one) before the lease's expiry by the local clock; a load that fails — lease lapsed, daemon gone, copy error — reports 0 tokens from then on and
the engine recomputes the whole prefix.

Save (:class:`LayerwiseSave`): slots for the request's new full chunks are reserved up front (invisible to
everyone); :meth:`LayerwiseSave.save_layer` copies layer l of every reserved chunk out of the engine's
tensors as soon as the engine has computed it (or :meth:`LayerwiseSave.save_chunks` every layer of some
chunks, for an engine that completes a prompt's chunks over several steps); :meth:`LayerwiseSave.commit`
publishes the chunks and is only accepted once every layer (or every reserved chunk) was saved; :meth:`LayerwiseSave.abort` (also on leaving the ``with`` block without
a commit) drops the reservation, so that no partial chunk is ever visible. On CUDA the device-to-host copy of
a layer runs on the engine's current stream (ordered after the compute that produced it).

Primitives:
    ChunkBuffers: the chunk buffers of a load or save, held open while copies run.
    LayerwiseLoad: wait_layer, tokens_loaded, layers_done, timeline, result, close; a context manager;
        ``unleased`` for loads that hold no lease.
    LayerwiseSave: save_layer / save_chunks, commit, abort; ``failed``; a context manager; ``empty`` for saves
        that store nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

import torch

from tiercache.errors import ConflictError, InvalidArgumentError, TierCacheError
from tiercache.layout import KVLayout

from .kv import EngineKV, chunk_to_kv, chunks_to_kv, kv_to_chunk
from .kv_check import check_kv
from .outcomes import LoadResult, StoreResult

logger = logging.getLogger(__name__)

ChunkBuffers = AbstractContextManager[Sequence[tuple[int, torch.Tensor]]]
"""Entered by the copier: yields ``(chunk position, 1-D uint8 chunk buffer)`` pairs, valid until exit."""


def _check_layer(layout: KVLayout, layer: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < layout.num_layers:
        raise InvalidArgumentError("layer", f"must be in [0, {layout.num_layers}), got {layer!r}")


class LayerwiseLoad:
    """One load running layer by layer in a background thread (from :meth:`KVConnector.load_layerwise`).

    Typical use::

        with connector.load_layerwise(tokens, kv, LoadPolicy.timeout(0.05)) as load:
            for layer in range(num_layers):
                if load.wait_layer(layer) == 0 and layer == 0:
                    ...  # nothing loaded: recompute as usual
                ...  # compute layer ``layer`` for the tokens after load.tokens_loaded
            result = load.result()  # tokens_loaded 0 here means: the load failed, recompute everything

    Attributes:
        layout: the KV layout.
    """

    def __init__(
        self,
        layout: KVLayout,
        kv: EngineKV,
        buffers: ChunkBuffers | None,
        planned: LoadResult,
        valid: Callable[[], bool],
        release: Callable[[], object],
        on_result: Callable[[LoadResult], None],
        inline: bool = False,
    ) -> None:
        """Start copying (internal: made by the connector or an engine adapter).

        Args:
            layout: the KV layout.
            kv: the engine's tensors (already checked against the layout).
            buffers: the chunks to copy; None when there is nothing to load.
            planned: the result once every layer has arrived.
            valid: whether the lease still covers a copy that finished now (local clock).
            release: ends the lease (best effort, never raises); called once, by the worker; returning False
                says the lease may not have covered the copies (the load then fails).
            on_result: told the final result once (usage reporting; best effort).
            inline: into CPU tensors, copy every layer before returning, on the caller's thread (an engine
                whose cores all run the forward pass gains nothing from a copy thread).
        """
        self.layout = layout
        self._kv = kv
        self._planned = planned
        self._valid = valid
        self._release = release
        self._on_result = on_result
        self._cond = threading.Condition()
        self._layers_done = 0
        self._finished = False
        self._failed = False
        self._stop = threading.Event()
        self._events: list[torch.cuda.Event] = []
        self._timeline: list[tuple[float, float]] = []
        self._stream: torch.cuda.Stream | None = None
        self._thread: threading.Thread | None = None
        device = kv.layers[0].device
        if buffers is None:
            self._finish(ok=True, failed=planned.tokens_loaded == 0)
            return
        if inline and device.type == "cpu":
            self._run(buffers)
            return
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            self._stream.wait_stream(torch.cuda.current_stream(device))
        # Not a daemon thread: a load nobody closed is waited for at interpreter exit (its copies are
        # bounded by the lease), never killed inside a torch copy, which aborts the process.
        self._thread = threading.Thread(target=self._run, args=(buffers,), name="tiercache-layerwise-load")
        self._thread.start()

    @classmethod
    def unleased(
        cls,
        layout: KVLayout,
        kv: EngineKV,
        planned: LoadResult,
        on_result: Callable[[LoadResult], None],
        buffers: ChunkBuffers | None = None,
    ) -> LayerwiseLoad:
        """A load under no lease: nothing to copy (``buffers`` None: ``planned`` is final at once), or
        chunks already received into buffers of this process."""
        return cls(
            layout, kv, buffers, planned, valid=lambda: True, release=lambda: None, on_result=on_result
        )

    # ------------------------------------------------------------------ engine side

    @property
    def tokens_loaded(self) -> int:
        """Tokens whose KV is (or, while layers are still copying, will be) in the engine's tensors; 0 once
        the load has failed."""
        with self._cond:
            return 0 if self._failed else self._planned.tokens_loaded

    @property
    def layers_done(self) -> int:
        """Layers completely copied (on CUDA: issued) so far."""
        with self._cond:
            return self._layers_done

    @property
    def timeline(self) -> tuple[tuple[float, float], ...]:
        """Per layer copied so far, ``time.perf_counter()`` when its copies started and ended (on CUDA:
        were issued)."""
        with self._cond:
            return tuple(self._timeline)

    def wait_layer(self, layer: int, timeout_s: float | None = None) -> int:
        """Wait until layer ``layer`` of every loaded chunk is in the engine's tensors.

        On CUDA the wait is enqueued on the caller's current stream (work issued after this call sees the
        layer); the host waits only until the layer's copies are issued.

        Args:
            layer: the layer.
            timeout_s: give up after this long (the load then counts as failed for this caller: 0).

        Returns:
            ``tokens_loaded``: 0 when nothing was loaded or the load failed (then recompute the whole prefix,
            even if earlier layers returned more).

        Raises:
            InvalidArgumentError: ``layer`` out of range.
        """
        _check_layer(self.layout, layer)
        with self._cond:
            arrived = self._cond.wait_for(lambda: self._layers_done > layer or self._finished, timeout_s)
            if not arrived or self._failed or self._layers_done <= layer:
                return 0
            event = self._events[layer] if self._events else None
        if event is not None:
            torch.cuda.current_stream(self._kv.layers[0].device).wait_event(event)
        return self._planned.tokens_loaded

    def result(self, timeout_s: float | None = None) -> LoadResult:
        """Wait for the last layer (or the failure) and return the outcome (0 tokens loaded on failure)."""
        with self._cond:
            self._cond.wait_for(lambda: self._finished, timeout_s)
            failed = self._failed or not self._finished
        return self._failure() if failed else self._planned

    def close(self) -> None:
        """Stop copying (if still running) and wait until the lease is released (idempotent)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> LayerwiseLoad:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ worker

    def _failure(self) -> LoadResult:
        p = self._planned
        return LoadResult(
            p.tokens_looked_up,
            p.tokens_hit,
            0,
            p.remote,
            p.tokens_cached,
            estimated_load_s=p.estimated_load_s,
            estimated_recompute_s=p.estimated_recompute_s,
        )

    def _run(self, buffers: ChunkBuffers) -> None:
        ok = False
        try:
            with buffers as chunks:
                ok = self._copy_layers(chunks)
        except Exception:
            logger.exception("layerwise load failed; the engine recomputes")
        finally:
            if self._release() is False:
                logger.warning("load lease lapsed during the copy; recomputing")
                ok = False
            self._finish(ok, failed=not ok)

    def _copy_layers(self, chunks: Sequence[tuple[int, torch.Tensor]]) -> bool:
        try:
            return self._copy_each_layer(chunks)
        finally:
            if self._stream is not None:
                self._stream.synchronize()  # the slots may be unmapped or reused once this returns

    def _copy_each_layer(self, chunks: Sequence[tuple[int, torch.Tensor]]) -> bool:
        for layer in range(self.layout.num_layers):
            if self._stop.is_set():
                return False
            event: torch.cuda.Event | None = None
            started = time.perf_counter()
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    for index, buf in chunks:  # queued: from a pinned segment the copies are asynchronous
                        chunk_to_kv(self.layout, buf, self._kv, index, layers=(layer,), non_blocking=True)
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(self._stream)
            else:
                chunks_to_kv(self.layout, chunks, self._kv, layer)
            if not self._valid():
                logger.warning("load lease lapsed during layer %d; recomputing", layer)
                return False
            with self._cond:
                if event is not None:
                    self._events.append(event)
                self._timeline.append((started, time.perf_counter()))
                self._layers_done = layer + 1
                self._cond.notify_all()
        if self._stream is not None:
            self._stream.synchronize()  # queued copies: the lease must have held until the last one ended
            if not self._valid():
                logger.warning("load lease lapsed before the last layer's copies ended; recomputing")
                return False
        return True

    def _finish(self, ok: bool, failed: bool) -> None:
        with self._cond:
            self._finished = True
            self._failed = failed
            if ok and not failed:
                self._layers_done = self.layout.num_layers
            self._cond.notify_all()
        try:
            self._on_result(self._failure() if failed else self._planned)
        except Exception:
            logger.exception("reporting a layerwise load's outcome failed")


class LayerwiseSave:
    """One store filled layer by layer (from :meth:`KVConnector.begin_save`).

    Typical use::

        with connector.begin_save(tokens) as save:
            for layer in range(num_layers):
                ...  # compute layer ``layer``
                save.save_layer(layer, kv)
            result = save.commit()  # leaving the block without commit aborts: nothing becomes visible

    Attributes:
        layout: the KV layout.
        num_chunks: full chunks of the prompt.
    """

    def __init__(
        self,
        layout: KVLayout,
        num_chunks: int,
        buffers: ChunkBuffers | None,
        commit: Callable[[], int],
        abort: Callable[[], None],
        skipped_chunks: int,
        remote: bool,
    ) -> None:
        """Hold the reserved buffers (internal: made by the connector).

        Args:
            layout: the KV layout.
            num_chunks: full chunks of the prompt.
            buffers: the reserved chunk buffers; None when there is nothing to store (or the daemon failed).
            commit: publishes the filled chunks, returns how many were added (raises TierCacheError).
            abort: drops the reservation (best effort, never raises).
            skipped_chunks: chunks not reserved (already cached or being stored elsewhere).
            remote: whether the byte stream carries the chunks.
        """
        self.layout = layout
        self.num_chunks = num_chunks
        self._commit = commit
        self._abort = abort
        self._skipped = skipped_chunks
        self._remote = remote
        self._saved: set[int] = set()
        self._saved_chunks: set[int] = set()
        self._commit_failed = False
        self._state = "open" if buffers is not None else "empty"
        self._holder = buffers
        self._chunks: Sequence[tuple[int, torch.Tensor]] = ()
        if buffers is not None:
            try:
                self._chunks = buffers.__enter__()
            except TierCacheError as exc:
                logger.warning("layerwise save: the reserved slots are unreachable (%s); not caching", exc)
                self._holder = None
                self._fail()

    @classmethod
    def empty(cls, layout: KVLayout, num_chunks: int, skipped_chunks: int, remote: bool) -> LayerwiseSave:
        """A save that stores nothing (all cached, or the daemon failed): its calls are no-ops."""
        return cls(layout, num_chunks, None, lambda: 0, lambda: None, skipped_chunks, remote)

    @property
    def open(self) -> bool:
        """Whether layers are still being accepted into a reservation."""
        return self._state == "open"

    def save_layer(self, layer: int, kv: EngineKV) -> None:
        """Copy layer ``layer`` of every reserved chunk out of the engine's tensors.

        A no-op when nothing is being stored (all cached, or the daemon failed).

        Raises:
            InvalidArgumentError: ``layer`` out of range or ``kv`` not matching the layout.
            ConflictError: the save was already committed or aborted by the caller.
        """
        _check_layer(self.layout, layer)
        if self._state in ("committed", "aborted"):
            raise ConflictError(f"save_layer({layer}): the save was already {self._state}")
        check_kv(self.layout, kv, self.num_chunks)
        for index, buf in self._chunks:
            kv_to_chunk(self.layout, kv, index, buf, layers=(layer,))
        self._saved.add(layer)

    @property
    def failed(self) -> bool:
        """Whether the reservation or its commit failed (nothing of this save became visible)."""
        return self._state == "failed" or self._commit_failed

    def save_chunks(self, kv: EngineKV, positions: Iterable[int], non_blocking: bool = False) -> None:
        """Copy every layer of the reserved chunks at ``positions`` out of the engine's tensors (positions not
        reserved are skipped: cached, or stored by someone else).

        Args:
            kv: the engine's tensors, holding at least those chunks (the caller checked them).
            positions: chunk positions in the prompt.
            non_blocking: from CUDA tensors, queue the copies on the current stream (synchronize it before
                the commit).

        Raises:
            ConflictError: the save was already committed or aborted by the caller.
        """
        if self._state in ("committed", "aborted"):
            raise ConflictError(f"save_chunks: the save was already {self._state}")
        wanted = set(positions)
        for index, buf in self._chunks:
            if index in wanted:
                kv_to_chunk(self.layout, kv, index, buf, non_blocking=non_blocking)
                self._saved_chunks.add(index)

    def commit(self) -> StoreResult:
        """Publish the chunks (visible to others from now on); only after every layer was saved.

        Returns:
            Tokens offered, stored and skipped (0 stored when the daemon failed: never raises for that).

        Raises:
            ConflictError: a layer was not saved yet, or the save was already committed or aborted.
        """
        c = self.layout.chunk_tokens
        offered = self.num_chunks * c
        if self._state in ("committed", "aborted"):
            raise ConflictError(f"commit: the save was already {self._state}")
        if self._saved_chunks:
            unsaved = sorted({index for index, _ in self._chunks} - self._saved_chunks)
            if unsaved:
                raise ConflictError(f"commit: chunks {unsaved} were not saved yet")
        else:
            missing = sorted(set(range(self.layout.num_layers)) - self._saved)
            if missing:
                raise ConflictError(f"commit: layers {missing} were not saved yet")
        if self._state != "open":
            self._state = "committed"
            return StoreResult(offered, 0, self._skipped * c, self._remote)
        self._release_buffers()
        try:
            stored = self._commit()
        except TierCacheError as exc:
            logger.warning("layerwise save: commit failed (%s); %d tokens not cached", exc, offered)
            self._abort()
            self._commit_failed = True
            stored = 0
        self._state = "committed"
        return StoreResult(offered, stored * c, self._skipped * c, self._remote)

    def abort(self) -> None:
        """Drop the reservation: none of the chunks becomes visible (idempotent; never raises)."""
        if self._state in ("committed", "aborted"):
            return
        self._release_buffers()
        if self._state == "open":
            self._abort()
        self._state = "aborted"

    def __enter__(self) -> LayerwiseSave:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.abort()

    def _release_buffers(self) -> None:
        holder, self._holder = self._holder, None
        self._chunks = ()
        if holder is not None:
            holder.__exit__(None, None, None)

    def _fail(self) -> None:
        self._abort()
        self._state = "failed"

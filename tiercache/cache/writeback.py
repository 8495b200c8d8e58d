"""The write-back worker: write-downs decided at commit or on a hit run on one background thread.

A write-down copies a chunk into every slower tier lacking it, one tier at a time, through the mover
(:meth:`~tiercache.cache.mover.Mover.write_down_step`). A write-down that finds no room in a tier, or fails,
is counted; the chunk stays where it is. The mover logs each such drop once (a warning naming the chunk,
the tier and the reason); the worker adds only the traceback of a failure, at debug level.

The worker's own lock guards only its set of pending futures; :meth:`WriteBack.schedule` may be called
with the index lock held (index lock first, then this one), and the worker takes neither while it copies.

The worker runs at a lower CPU priority (:data:`WRITE_DOWN_NICE`): a write-down is never on a request's
path, and an eviction that outruns it demotes the chunk itself; on a busy host it then takes only the CPU the
engines leave (measured: half of the daemon's CPU under ``vllm serve`` chat traffic, ~8 % of a core on a
2-core host where vLLM's engine and worker busy-poll both cores).

Primitives:
    WRITE_DOWN_NICE: how much the worker lowers its CPU priority (Linux nice increment).
    WriteBack: schedule, schedule_many, flush, settle, pending, failed, close.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from tiercache.cache.mover import MoveOutcome
from tiercache.priority import lower_thread_priority

logger = logging.getLogger(__name__)

WRITE_DOWN_NICE = 10
"""Nice increment of the write-down thread (Linux sets it per thread): it yields the CPU to serving threads."""


class WriteBack:
    """Queued write-downs on one worker thread."""

    def __init__(self, step: Callable[[bytes], MoveOutcome | None]) -> None:
        """Args: step: copies a chunk one tier further down; None when no slower tier lacks it."""
        self._step = step
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="tiercache-writedown",
            initializer=lower_thread_priority,
            initargs=(WRITE_DOWN_NICE, "write-down"),
        )
        self._lock = threading.Lock()
        self._pending: dict[Future[None], int] = {}  # a job and how many chunks it writes down
        self._failed = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Write-downs (chunks) queued or running."""
        with self._lock:
            return sum(self._pending.values())

    @property
    def failed(self) -> int:
        """Write-downs that found no room or failed."""
        with self._lock:
            return self._failed

    def schedule(self, cid: bytes) -> None:
        """Queue copies of a chunk into every slower tier that lacks it (ignored once closing)."""
        self.schedule_many([cid])

    def schedule_many(self, cids: Sequence[bytes]) -> None:
        """Queue the write-downs of several chunks as one job (a commit's: one hand-off to the worker, not
        one per chunk), done in order (ignored once closing)."""
        if not cids:
            return
        with self._lock:
            if self._closed:
                return
            fut = self._executor.submit(self._write_downs, list(cids))
            self._pending[fut] = len(cids)
        fut.add_done_callback(self._done)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write-down queued so far has finished."""
        with self._lock:
            pending = list(self._pending)
        for fut in pending:
            fut.result(timeout=timeout_s)

    def settle(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` in all for the write-downs queued so far; whether they all finished.
        Call without the index lock (the worker takes it)."""
        with self._lock:
            pending = list(self._pending)
        return not wait(pending, timeout=timeout_s).not_done

    def close(self) -> None:
        """Finish what is queued, then stop the worker (idempotent)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            self._pending.pop(fut, None)

    def _write_downs(self, cids: list[bytes]) -> None:
        for cid in cids:
            self._write_down(cid)

    def _write_down(self, cid: bytes) -> None:
        try:
            while True:
                outcome = self._step(cid)
                if outcome is MoveOutcome.DONE:
                    continue
                if outcome is MoveOutcome.NO_ROOM:  # logged by the mover as a dropped chunk
                    with self._lock:
                        self._failed += 1
                return
        except Exception:  # logged by the mover as a dropped chunk; the traceback only for debugging
            logger.debug("write-down of %s failed", cid.hex(), exc_info=True)
            with self._lock:
                self._failed += 1

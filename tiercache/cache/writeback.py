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

Deferred write-downs (:meth:`WriteBack.defer`: the chunks a ``watermark`` policy kept only above while the
fast tier had room) wait in a backlog, oldest first, and are caught up only while the host has a core to
spare: a catch-up thread reads the host's idle cores every :data:`CATCH_UP_INTERVAL_S` (the worker's own CPU
counted as idle, since it is what the catch-up itself takes) and, from a whole core on (the config's
``catch_up_spare_cores``), has
the worker write the backlog down for one more interval, always after the write-downs queued meanwhile. So a
warm restart finds them in the slower tier once the host was idle for a moment, and serving traffic that
keeps every core busy never pays for them. A deferred chunk that is evicted first is demoted on the
eviction's path, as any other. :meth:`WriteBack.flush` and :meth:`WriteBack.close` (within its bound) write
the whole backlog down.

Primitives:
    WRITE_DOWN_NICE: how much the worker lowers its CPU priority (Linux nice increment).
    CATCH_UP_INTERVAL_S, BACKLOG_LIMIT: when deferred write-downs run, and how many wait.
    WriteBack: schedule, schedule_many, defer, flush, settle, pending, deferred, failed, close.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from tiercache.cache.config import CATCH_UP_SPARE_CORES
from tiercache.cache.mover import MoveOutcome
from tiercache.hostcpu import IdleCores
from tiercache.priority import lower_thread_priority

logger = logging.getLogger(__name__)

WRITE_DOWN_NICE = 10
"""Nice increment of the write-down thread (Linux sets it per thread): it yields the CPU to serving threads."""

CATCH_UP_INTERVAL_S = 0.5
"""How often the host's idle cores are read while deferred write-downs wait, and how long the worker then
catches up before they are read again."""

BACKLOG_LIMIT = 1 << 18
"""Deferred write-downs kept at most (~100 bytes each); past it the oldest is forgotten, its chunk then goes
down only when evicted, as under on-evict."""


class WriteBack:
    """Queued write-downs on one worker thread."""

    def __init__(
        self,
        step: Callable[[bytes], MoveOutcome | None],
        spare_cores: float = CATCH_UP_SPARE_CORES,
        idle: Callable[[], float] | None = None,
        interval_s: float = CATCH_UP_INTERVAL_S,
    ) -> None:
        """Args: step: copies a chunk one tier further down, None when no slower tier lacks it; spare_cores:
        idle cores from which deferred write-downs run; idle: the host's idle cores since its previous call
        (``/proc/stat`` when None); interval_s: see :data:`CATCH_UP_INTERVAL_S`."""
        self._step = step
        self._spare_cores = spare_cores
        self._idle = idle
        self._interval_s = interval_s
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="tiercache-writedown", initializer=self._started
        )
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: dict[Future[None], int] = {}  # a job and how many chunks it writes down
        self._backlog: dict[bytes, None] = {}  # deferred write-downs, oldest first
        self._catcher: threading.Thread | None = None
        self._worker_clock: int | None = None  # the worker's CPU-time clock, once it started
        self._failed = 0
        self._closed = False

    @property
    def pending(self) -> int:
        """Write-downs (chunks) queued or running."""
        with self._lock:
            return sum(self._pending.values())

    @property
    def deferred(self) -> int:
        """Deferred write-downs (chunks) not caught up yet."""
        with self._lock:
            return len(self._backlog)

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

    def defer(self, cids: Iterable[bytes]) -> None:
        """Keep write-downs for when the host has a core to spare (ignored once closing)."""
        with self._lock:
            if self._closed:
                return
            for cid in cids:
                self._backlog[cid] = None
            while len(self._backlog) > BACKLOG_LIMIT:
                del self._backlog[next(iter(self._backlog))]
            if not self._backlog:
                return
            if self._catcher is None and math.isfinite(self._spare_cores):
                self._catcher = threading.Thread(
                    target=self._catch_ups, name="tiercache-catchup", daemon=True
                )
                self._catcher.start()
            self._wake.notify_all()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every write-down queued so far has finished, the deferred ones included (written down
        now, whether or not the host is idle)."""
        with self._lock:
            pending = list(self._pending)
            closed = self._closed
        for fut in pending:
            fut.result(timeout=timeout_s)
        if not closed:  # the worker runs one job at a time: this one also waits for a catch-up under way
            with contextlib.suppress(RuntimeError):  # closed meanwhile: close writes down what it can
                self._executor.submit(self._catch_up, None).result(timeout=timeout_s)

    def settle(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` in all for the write-downs queued so far; whether they all finished.
        Call without the index lock (the worker takes it)."""
        with self._lock:
            pending = list(self._pending)
        return not wait(pending, timeout=timeout_s).not_done

    def close(self, catch_up_s: float = 0.0) -> None:
        """Finish what is queued, write down deferred chunks for at most ``catch_up_s`` more (counting the
        rest, which stay only above), then stop the worker (idempotent)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            self._wake.notify_all()
            catcher = self._catcher
        if first and catch_up_s > 0:
            with contextlib.suppress(RuntimeError):  # a second close raced this one past shutdown
                self._executor.submit(self._catch_up, time.monotonic() + catch_up_s)
        self._executor.shutdown(wait=True)
        if catcher is not None:
            catcher.join()
        with self._lock:
            left, self._backlog = len(self._backlog), {}
        if first and left:
            logger.warning(
                "%d chunks stored while their tier was under its watermark were not written down before the "
                "stop: they are gone with it (misses after a restart)",
                left,
            )

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            self._pending.pop(fut, None)

    def _started(self) -> None:
        """The worker's first act: lower its priority and note its CPU clock (the catch-up discounts it)."""
        lower_thread_priority(WRITE_DOWN_NICE, "write-down")
        with contextlib.suppress(AttributeError, OSError):  # no per-thread clocks: the worker counts as busy
            self._worker_clock = time.pthread_getcpuclockid(threading.get_ident())

    def _worker_cpu_s(self) -> float:
        clock = self._worker_clock
        if clock is None:
            return 0.0
        try:
            return time.clock_gettime(clock)
        except OSError:
            return 0.0

    def _catch_ups(self) -> None:
        """The catch-up thread: while deferred write-downs wait, read the host's idle cores over an interval,
        and while a core was spare let the worker catch up for an interval (measured the same way)."""
        idle = self._idle if self._idle is not None else IdleCores()
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._closed or bool(self._backlog))
                if self._closed:
                    return
            idle()  # the interval starts now
            worker, start = self._worker_cpu_s(), time.monotonic()
            with self._lock:
                if self._wake.wait_for(lambda: self._closed, timeout=self._interval_s):
                    return
            while self._spare(idle(), worker, start) >= self._spare_cores:
                worker, start = self._worker_cpu_s(), time.monotonic()
                try:
                    self._executor.submit(self._catch_up, start + self._interval_s, True).result()
                except RuntimeError:  # shut down meanwhile
                    return
                with self._lock:
                    if self._closed or not self._backlog:
                        break

    def _spare(self, idle: float, worker: float, start: float) -> float:
        """Idle cores since ``start``, the worker's own CPU since then (at ``worker`` seconds) counted idle."""
        return idle + (self._worker_cpu_s() - worker) / max(time.monotonic() - start, 1e-3)

    def _catch_up(self, until: float | None, yielding: bool = False) -> None:
        """Write deferred chunks down, oldest first, until none is left or ``until`` (monotonic) passed; when
        ``yielding``, also as soon as other write-downs are queued (they go first)."""
        while True:
            with self._lock:
                if not self._backlog or (until is not None and time.monotonic() >= until):
                    return
                if yielding and (self._pending or self._closed):
                    return
                cid = next(iter(self._backlog))
                del self._backlog[cid]
            self._write_down(cid)

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

"""Copies received chunks into the engine's KV on a thread of its own, while the caller receives the next.

A byte-stream load receives a chunk's pieces, assembles them in a buffer, then scatters the chunk into the
engine's per-layer tensors. Done on the receiving thread, the scatter waits for the next piece and the next
piece waits for the scatter; worse, torch's intra-op workers (OpenMP) spin between the scatter's per-layer
copies and take the cores that gRPC's receiving thread and a same-host daemon need: measured on a 2-core
host, a 128 MiB load of 512 KiB chunks ran at 0.02 GB/s with torch's 2 intra-op threads and at 0.5 GB/s
with 1. So the scatter runs on one worker thread that uses a single intra-op thread (set on that thread
only: the engine's own threads keep their setting), behind the receiver, with ``depth`` assembly buffers
in rotation. Small chunks are assembled side by side in runs of ``RUN_BYTES`` and scattered a run at a
time (one copy per layer), so that a stream of 512 KiB chunks pays no thread hand-off per chunk.

A byte-stream store works the other way round, with the same thread setting: :func:`staged_chunks`
gathers each chunk out of the KV on its own worker, one chunk ahead of the sender.

Primitives:
    ChunkCopier: ``buffer`` (a free assembly buffer), ``submit`` (a whole chunk, scattered with its run),
        ``finish``; a context manager that always waits for its copies and stops its thread.
    RUN_BYTES: the bytes of chunks scattered together.
    staged_chunks: the chunks at some positions of the KV, gathered one ahead on a worker thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import torch

from tiercache.layout import KVLayout

from .kv import EngineKV, kv_to_chunk, run_to_kv
from .results import StreamChunk


def _single_intraop_thread() -> None:
    torch.set_num_threads(1)


RUN_BYTES = 4 << 20
"""Bytes of consecutive chunks scattered in one go (at least one chunk): small chunks are gathered into runs."""


class ChunkCopier:
    """Scatters whole chunks into an engine's KV on a worker thread, overlapping the next chunks' receipt.

    Chunks are assembled in the rows of run buffers (``[n, chunk_bytes]``, ``n`` chunks of at most
    ``run_bytes`` together, at least one): a run is scattered once it is full (or at :meth:`finish`), with one
    copy per layer for all its chunks (:func:`~.kv.run_to_kv`), so small chunks pay no thread hand-off and
    no per-layer copy call each.
    """

    def __init__(self, layout: KVLayout, kv: EngineKV, depth: int = 2, run_bytes: int = RUN_BYTES) -> None:
        """Args:
        layout: the KV layout.
        kv: the engine's tensors.
        depth: run buffers in rotation (2: one being filled while the other is copied).
        run_bytes: the most bytes of a run buffer (it holds at least one chunk).
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._layout = layout
        self._kv = kv
        self._depth = depth
        self._per_run = max(1, run_bytes // layout.chunk_bytes)
        self._made = 0
        self._pending: deque[tuple[Future[None], torch.Tensor]] = deque()
        self._free: list[torch.Tensor] = []
        self._run: torch.Tensor | None = None  # the run being filled
        self._first = 0  # chunk index of its row 0
        self._rows = 0  # its rows holding submitted chunks
        self._row: memoryview | None = None  # the row handed out by buffer(), not submitted yet
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="tiercache-copy", initializer=_single_intraop_thread
        )

    def __enter__(self) -> ChunkCopier:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self.finish()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def buffer(self) -> memoryview:
        """A buffer to assemble the next chunk in: the next row of the run being filled, or the first row of
        a run buffer (a new one while fewer than ``depth`` exist, else the oldest copy's, once it is done).

        Raises:
            Exception: the copy that last read the run buffer failed (its exception).
        """
        if self._run is None:
            self._run = self._take_run()
            self._rows = 0
        self._row = self._run[self._rows].numpy().data
        return self._row

    def _take_run(self) -> torch.Tensor:
        if self._free:
            return self._free.pop()
        if self._made >= self._depth and self._pending:
            future, run = self._pending.popleft()
            future.result()
            return run
        self._made += 1
        return torch.empty((self._per_run, self._layout.chunk_bytes), dtype=torch.uint8)

    def submit(self, chunk: StreamChunk) -> None:
        """Take ``chunk``, assembled in the last buffer from :meth:`buffer`; the run is scattered into the
        KV (on the worker) once it is full.

        Raises:
            ValueError: ``chunk`` was not assembled in that buffer, or does not follow the run's chunks.
        """
        if self._run is None or chunk.data is not self._row:
            raise ValueError("submit a chunk assembled in the buffer buffer() gave last")
        if self._rows == 0:
            self._first = chunk.index
        elif chunk.index != self._first + self._rows:
            raise ValueError(f"chunk {chunk.index} does not follow chunk {self._first + self._rows - 1}")
        self._row = None
        self._rows += 1
        if self._rows == self._per_run:
            self._flush()

    def _flush(self) -> None:
        """Scatter the run being filled (its submitted rows), on the worker."""
        if self._run is None or self._rows == 0:
            return
        run, rows = self._run, self._rows
        self._run, self._rows = None, 0
        future = self._pool.submit(run_to_kv, self._layout, run[:rows], self._kv, self._first)
        self._pending.append((future, run))

    def finish(self) -> None:
        """Scatter what is left and wait for every copy.

        Raises:
            Exception: the first copy that failed (its exception).
        """
        self._flush()
        while self._pending:
            future, run = self._pending.popleft()
            future.result()
            self._free.append(run)


def staged_chunks(
    layout: KVLayout, kv: EngineKV, positions: Sequence[int], depth: int = 2
) -> Iterator[torch.Tensor]:
    """The chunks at ``positions`` of ``kv``, each gathered into a staging buffer on a worker thread
    while the caller sends the one before.

    A yielded buffer is reused ``depth`` chunks later, once the caller asks for the next chunk: the caller
    must be done with it by then (the byte stream writes a chunk's pieces to the wire before it asks).

    Raises:
        Exception: the gather of a chunk failed (its exception, when that chunk is due).
    """
    if not positions:
        return
    with ThreadPoolExecutor(
        1, thread_name_prefix="tiercache-stage", initializer=_single_intraop_thread
    ) as pool:
        buffers = [
            torch.empty(layout.chunk_bytes, dtype=torch.uint8) for _ in range(min(depth, len(positions)))
        ]
        due: deque[tuple[Future[None], torch.Tensor]] = deque()
        upcoming = iter(positions)
        for buf, position in zip(buffers, upcoming):
            due.append((pool.submit(kv_to_chunk, layout, kv, position, buf), buf))
        while due:
            future, buf = due.popleft()
            future.result()
            yield buf
            following = next(upcoming, None)
            if following is not None:
                due.append((pool.submit(kv_to_chunk, layout, kv, following, buf), buf))

"""Copies received chunks into the engine's KV on a thread of its own, while the caller receives the next.

A byte-stream load receives a chunk's pieces, assembles them in a buffer, then scatters the chunk into the
engine's per-layer tensors. Done on the receiving thread, the scatter waits for the next piece and the next
piece waits for the scatter; worse, torch's intra-op workers (OpenMP) spin between the scatter's per-layer
copies and take the cores that gRPC's receiving thread and a same-host daemon need: measured on a 2-core
host, a 128 MiB load of 512 KiB chunks ran at 0.02 GB/s with torch's 2 intra-op threads and at 0.5 GB/s
with 1. So the scatter runs on one worker thread that uses a single intra-op thread (set on that thread
only: the engine's own threads keep their setting), one chunk behind the receiver, with ``depth``
assembly buffers in rotation. A chunk that arrived whole in one message is scattered straight from that
message (lent, read-only: no assembly copy); at most ``depth`` copies are pending either way.

When the engine's KV is contiguous CPU memory (:func:`~.kv.chunk_parts`), nothing is assembled at all:
:class:`PieceCopier` writes every checked piece straight to its place in the KV (a piece of a large chunk
spans several layers' K and V), one copy per byte, also on one worker thread, a few pieces behind the
receiver. A chunk counts as loaded only once its last piece is checked and every piece's copy is done.

A byte-stream store works the other way round, with the same thread setting: :func:`staged_chunks`
gathers each chunk out of the KV on its own worker, one chunk ahead of the sender.

Primitives:
    ChunkCopier: ``buffer`` (a free assembly buffer), ``submit`` (scatter a whole chunk), ``finish``;
        a context manager that always waits for its copies and stops its thread.
    PieceCopier: ``submit`` (write one checked piece into the KV), ``finish``; the same context manager.
    staged_chunks: the chunks at some positions of the KV, gathered one ahead on a worker thread.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TypeVar

import numpy as np
import torch

from tiercache.layout import KVLayout
from tiercache.wire.pieces import cut_parts

from .kv import EngineKV, chunk_to_kv, kv_to_chunk
from .results import StreamChunk
from .stream import StreamPiece


def _single_intraop_thread() -> None:
    torch.set_num_threads(1)


_W = TypeVar("_W", bound="_Worker")


class _Worker(ABC):
    """A copier's one worker thread, as a context manager: a clean exit waits for every copy
    (:meth:`finish`, raising the first failure); any exit stops the thread, dropping copies not started."""

    def __init__(self, initializer: Callable[[], None] | None = None) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tiercache-copy", initializer=initializer)

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self.finish()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @abstractmethod
    def finish(self) -> None:
        """Wait for every submitted copy, raising the first that failed."""


class ChunkCopier(_Worker):
    """Scatters whole chunks into an engine's KV on a worker thread, overlapping the next chunk's receipt."""

    def __init__(self, layout: KVLayout, kv: EngineKV, depth: int = 2) -> None:
        """Args:
        layout: the KV layout.
        kv: the engine's tensors.
        depth: assembly buffers in rotation (2: one being filled while the other is copied).
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._layout = layout
        self._kv = kv
        self._depth = depth
        self._made = 0
        self._pending: deque[tuple[Future[None], bytearray | None]] = deque()  # None: a lent chunk
        self._free: list[bytearray] = []
        self._quiet = True  # the next lent chunk's view is made with torch's warning silenced
        super().__init__(_single_intraop_thread)

    def buffer(self) -> bytearray:
        """A buffer to assemble the next chunk in: a new one while fewer than ``depth`` exist, else the
        buffer of the oldest copy, once that copy is done.

        Raises:
            Exception: the copy that last read the buffer failed (its exception).
        """
        if self._free:
            return self._free.pop()
        if self._made < self._depth:
            self._made += 1
            return bytearray(self._layout.chunk_bytes)
        while True:  # every buffer made is free or pending (the caller holds none when it asks)
            buf = self._retire_oldest()
            if buf is not None:
                return buf

    def submit(self, chunk: StreamChunk) -> None:
        """Scatter ``chunk`` into the KV, on the worker: a chunk assembled in a buffer from :meth:`buffer`,
        or a lent read-only view of a received message (at most ``depth`` copies are pending: beyond, this
        waits for the oldest, so that lent messages do not pile up in memory).
        """
        data = chunk.data
        if isinstance(data, memoryview) and data.readonly:
            buf = None
            if self._quiet:  # only read: torch warns that it could write, once per process (it warns once)
                self._quiet = False
                with warnings.catch_warnings():  # so once per copier is enough: not a filter swap per chunk
                    warnings.simplefilter("ignore", UserWarning)
                    view = torch.frombuffer(data, dtype=torch.uint8)
            else:
                view = torch.frombuffer(data, dtype=torch.uint8)
        else:
            view = torch.frombuffer(data, dtype=torch.uint8)
            buf = data if isinstance(data, bytearray) else None
        while len(self._pending) >= self._depth:
            done = self._retire_oldest()
            if done is not None:
                self._free.append(done)
        future = self._pool.submit(chunk_to_kv, self._layout, view, self._kv, chunk.index)
        self._pending.append((future, buf))

    def _retire_oldest(self) -> bytearray | None:
        """Wait for the oldest pending copy; its buffer (None for a lent chunk).

        Raises:
            Exception: the copy failed (its exception).
        """
        future, buf = self._pending.popleft()
        future.result()
        return buf

    def finish(self) -> None:
        """Wait for every submitted copy.

        Raises:
            Exception: the first copy that failed (its exception).
        """
        while self._pending:
            buf = self._retire_oldest()
            if buf is not None:
                self._free.append(buf)


def _write_piece(targets: list[memoryview], data: memoryview) -> None:
    """Copy ``data`` into the consecutive ``targets`` (numpy: one thread, without holding the GIL)."""
    pos = 0
    for target in targets:
        end = pos + target.nbytes
        np.copyto(np.frombuffer(target, dtype=np.uint8), np.frombuffer(data[pos:end], dtype=np.uint8))
        pos = end


class PieceCopier(_Worker):
    """Writes checked pieces straight into an engine's KV on a worker thread, while the next ones arrive.

    Each piece's bytes go to their place in the chunk's parts (the engine's per-layer K and V, see
    :func:`~.kv.chunk_parts`): no assembly buffer, one copy per byte. At most ``depth`` pieces are pending
    (each keeps its received message alive); beyond, :meth:`submit` waits for the oldest. A load that fails
    inside a chunk (a bad piece, a lost stream) may leave part of that chunk written in the KV: it is never
    counted loaded, so the engine computes those tokens as for any miss.
    """

    def __init__(
        self, parts: Callable[[int], Sequence[memoryview]], chunk_bytes: int, depth: int = 3
    ) -> None:
        """Args:
        parts: chunk position -> its writable parts in the engine's memory, in chunk-buffer order.
        chunk_bytes: raw bytes per chunk (the parts of a chunk must cover exactly that many).
        depth: pieces pending at most.
        """
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._parts = parts
        self._chunk_bytes = chunk_bytes
        self._depth = depth
        self._pending: deque[Future[None]] = deque()
        super().__init__()

    def submit(self, piece: StreamPiece) -> None:
        """Write ``piece`` into its chunk's parts, on the worker.

        Raises:
            ValueError: the chunk's parts do not hold the piece (a KV too short for the chunk).
            Exception: an earlier copy failed (its exception).
        """
        data = memoryview(piece.data).cast("B")
        parts = self._parts(piece.index)
        held = sum(p.nbytes for p in parts)
        if held != self._chunk_bytes:
            raise ValueError(f"chunk {piece.index}: the KV holds {held} of its {self._chunk_bytes} bytes")
        targets = cut_parts(parts, piece.offset, piece.offset + data.nbytes)
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(_write_piece, targets, data))

    def finish(self) -> None:
        """Wait for every submitted copy.

        Raises:
            Exception: the first copy that failed (its exception).
        """
        while self._pending:
            self._pending.popleft().result()


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

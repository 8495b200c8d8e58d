"""The worker's loads: lease the cached chunks of each request, copy them into vLLM's blocks layer by layer.

``LayerLoader`` takes one step's leased loads and copies layer 0 of every chunk of every request, then
layer 1, ... On CUDA that runs in a background thread, on a side stream (which first waits for the engine's
stream) with one event per layer, so that the copy of layer l + 1 overlaps the model's compute of layer l,
and ``wait(l)`` only makes the engine's current stream wait on event l. Into a CPU cache the copies are
made at once, in the caller (``start_load_kv``, before the forward pass): the model's compute already keeps
every core busy, so a copy thread would only compete with it (and cost a thread start per step), and
``wait(l)`` returns at once. After the last layer each lease is released: when the local clock proves the lease held for the whole
copy, without waiting (the release rides on the namespace's next AcquireLoad or BeginStore, or goes
one-way shortly after: :meth:`~tiercache.connector.client.TierCacheClient.defer_release`); otherwise with a
waited release, and a lease the daemon does not confirm may have had its slots reused, so its blocks are
reported as load errors and vLLM recomputes them. A failed copy does the same for every block not yet known good.

A load over the byte stream (:class:`StreamedLoad`: no lease, the daemon's StreamLoad leases while it sends)
is received before the first layer is marked done, each chunk copied into its blocks (every layer) as soon as
it is whole; the blocks of chunks that did not arrive whole are load errors.

Primitives:
    leased_prefix: the slots of a lease that hold whole chunks ``0, 1, ...`` in order.
    LeasedLoad: one request's lease, slots and target blocks.
    StreamedLoad: one request's chunks to receive over the byte stream, and their target blocks.
    LayerLoader: start, wait(layer), finish() -> the block ids that failed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout

from ..client import TierCacheClient
from ..kv import PagedKV, chunk_to_kv
from ..results import LoadLease, SlotRef, StreamChunk
from ..segments import SlotAccess, SlotMapping
from ..stream_plane import ByteStreamPlane

logger = logging.getLogger(__name__)


def leased_prefix(lease: LoadLease, chunk_bytes: int) -> tuple[SlotRef, ...]:
    """The slots of ``lease`` holding chunks ``0 .. n - 1`` whole (a chunk missing or short ends the prefix)."""
    by_index = {r.index: r for r in lease.slots}
    refs: list[SlotRef] = []
    while len(refs) in by_index and by_index[len(refs)].nbytes == chunk_bytes:
        refs.append(by_index[len(refs)])
    return tuple(refs)


@dataclass(frozen=True, slots=True)
class LeasedLoad:
    """One request's load under a lease.

    Attributes:
        namespace: the request's namespace.
        lease: the daemon's lease (its slots hold chunks ``0 .. len(refs) - 1``).
        refs: the leased slots to copy, in chunk order.
        mapping: the shared-memory segment the slots are in.
        block_ids: the request's blocks covering the loaded chunks.
        first_block: blocks before this one are not written (vLLM computed them).
        started: local clock when the lease was asked for (its TTL started after this).
    """

    namespace: Namespace
    lease: LoadLease
    refs: tuple[SlotRef, ...]
    mapping: SlotMapping
    block_ids: tuple[int, ...]
    first_block: int
    started: float

    def target_blocks(self) -> set[int]:
        """The blocks this load writes."""
        return set(self.block_ids[self.first_block :])


@dataclass(frozen=True, slots=True)
class StreamedLoad:
    """One request's load over the byte stream.

    Attributes:
        plane: the byte stream of the request's namespace.
        keys: the keys of the chunks to load (the stream brings their contiguous cached prefix).
        block_ids: the request's blocks covering those chunks (the last chunk's may be only its first).
        first_block: blocks before this one are not written (vLLM computed them).
    """

    plane: ByteStreamPlane
    keys: tuple[bytes, ...]
    block_ids: tuple[int, ...]
    first_block: int


class LayerLoader:
    """Copies one step's leased loads into vLLM's KV cache, layer by layer (on CUDA in a background thread)."""

    def __init__(
        self,
        client: TierCacheClient,
        layout: KVLayout,
        caches: Sequence[torch.Tensor],
        loads: Sequence[LeasedLoad],
        clock: Callable[[], float] = time.monotonic,
        streamed: Sequence[StreamedLoad] = (),
    ) -> None:
        """Start copying at once (into a CPU cache: copy everything before returning).

        Args:
            client: the daemon client (to release the leases).
            layout: the namespace layout (chunk and block size).
            caches: per layer, the cache as ``[planes, num_blocks, plane_block_bytes]`` bytes.
            loads: the leased loads.
            clock: the local clock the leases' lifetimes are checked with.
            streamed: the loads over the byte stream.
        """
        self._client = client
        self._layout = layout
        self._caches = caches
        self._loads = loads
        self._streamed = streamed
        self._clock = clock
        self._cond = threading.Condition()
        self._done = 0
        self._finished = False
        self._failed: set[int] = set()
        device = caches[0].device
        self._stream: torch.cuda.Stream | None = None
        self._events: list[torch.cuda.Event] = []
        self._thread: threading.Thread | None = None
        if device.type == "cpu":
            self._run()  # the cores are the forward pass's: copy now (see the module docstring)
            return
        if device.type == "cuda":
            self._stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            self._stream.wait_stream(torch.cuda.current_stream(device))
        self._thread = threading.Thread(target=self._run, name="tiercache-vllm-load", daemon=True)
        self._thread.start()

    def wait(self, layer: int) -> None:
        """Block until layer ``layer`` is in the cache (on CUDA: the current stream waits for it)."""
        with self._cond:
            self._cond.wait_for(lambda: self._done > layer or self._finished)
            event = self._events[layer] if layer < len(self._events) else None
        if event is not None:
            torch.cuda.current_stream(self._caches[0].device).wait_event(event)

    def finish(self) -> set[int]:
        """Wait for the copies and the lease releases; the block ids whose KV is not trustworthy."""
        if self._thread is not None:
            self._thread.join()
        return set(self._failed)

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        for streamed in self._streamed:
            self._receive(streamed)
        try:
            with contextlib.ExitStack() as stack:
                views = [stack.enter_context(load.mapping.use()) for load in self._loads]
                self._copy(views)
                if self._events:
                    # Inside ``use``: from a pinned segment the copies are asynchronous, and a retired
                    # mapping is unmapped when its last user leaves; the slots may also be reused once the
                    # leases are released.
                    self._events[-1].synchronize()
        except Exception:
            logger.exception("tiercache load failed; vLLM recomputes the loaded blocks")
            for load in self._loads:
                self._failed |= load.target_blocks()
        finally:
            self._release_all()
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _kv(self, block_ids: Sequence[int], first_block: int) -> PagedKV:
        """A request's blocks in the registered caches, written from ``first_block`` on."""
        return PagedKV.of_blocks(self._caches, block_ids, first_block)

    def _receive(self, load: StreamedLoad) -> None:
        """Receive ``load``'s chunks over the byte stream into their blocks; failures become load errors."""
        per = self._layout.chunk_tokens // self._layout.page_tokens
        on_cpu = self._stream is None
        stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()

        kv = self._kv(load.block_ids, load.first_block)

        def consume(chunk: StreamChunk) -> None:
            with warnings.catch_warnings():  # a lent message is read-only: torch warns that it could write
                warnings.simplefilter("ignore", UserWarning)
                buf = torch.frombuffer(chunk.data, dtype=torch.uint8)
            with stream:
                chunk_to_kv(self._layout, buf, kv, chunk.index, non_blocking=not on_cpu)

        got = 0
        try:
            # Into a CPU cache each copy is done when ``consume`` returns: one assembly buffer serves all.
            got = load.plane.receive(load.keys, consume, reuse_buffer=on_cpu, lend=True)
        except TierCacheError as exc:
            logger.warning("tiercache stream load failed (%s); vLLM recomputes its blocks", exc)
        except Exception:
            logger.exception("tiercache stream load failed; vLLM recomputes its blocks")
        if got * per < len(load.block_ids):
            self._failed |= set(load.block_ids[max(got * per, load.first_block) :])

    def _copy(self, views: Sequence[SlotAccess]) -> None:
        kvs = [self._kv(load.block_ids, load.first_block) for load in self._loads]
        queued = self._stream is not None
        for layer in range(len(self._caches)):
            stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
            with stream:
                for slots, load, kv in zip(views, self._loads, kvs):
                    for ref in load.refs:
                        chunk_to_kv(
                            self._layout, slots.view(ref), kv, ref.index, (layer,), non_blocking=queued
                        )
                if self._stream is not None:
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(self._stream)
                    self._events.append(event)
            with self._cond:
                self._done = layer + 1
                self._cond.notify_all()

    def _release_all(self) -> None:
        for load in self._loads:
            if self._clock() < load.started + load.lease.expires_in_s:
                # The local clock proves the lease held (its TTL started after ``started``): no answer is
                # needed, the release rides on the namespace's next call (or goes one-way shortly).
                self._client.defer_release(load.namespace, load.lease.lease_id)
                continue
            try:
                covered = self._client.release_load(load.namespace, load.lease.lease_id)
            except TierCacheError as exc:
                logger.warning("releasing load lease %d failed (%s)", load.lease.lease_id, exc)
                covered = False  # neither the clock nor the daemon can prove the lease held
            if not covered:
                logger.warning("load lease %d lapsed during the copy; vLLM recomputes", load.lease.lease_id)
                self._failed |= load.target_blocks()

"""The byte-stream data plane (engines on another host, or ``data_plane`` ``stream``).

Whole chunks travel over gRPC streams, framed by :mod:`.stream` into messages within both ends' size limit
(per-piece zstd when the codec asks for it). A store first looks up the cached prefix and sends only what
follows it, each chunk written to the wire straight from the engine's tensors when they are contiguous CPU
memory (its per-layer K and V joined into the message in one copy), else gathered on a worker thread while
the one before is sent; a load receives the contiguous cached prefix and, for chunks that arrive in several
pieces into contiguous CPU tensors, writes each checked piece straight to its place in them on a worker
thread while the next piece arrives (:class:`~.copier.PieceCopier`: one copy per byte; a chunk counts once
its last piece is written); otherwise it copies each chunk as soon as it is complete
(:class:`~.copier.ChunkCopier`: two assembly buffers in rotation; a chunk that came whole in one raw message
is copied straight out of that message, never assembled). The daemon commits a stream store when the stream ends, so a failed stream leaves nothing visible.

Primitives:
    ByteStreamPlane: the :class:`~.dataplane.DataPlane` over StreamStore / StreamLoad.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from types import MappingProxyType

import torch

from tiercache.codec import Codec
from tiercache.layout import KVLayout
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire.framing import Framed

from .copier import ChunkCopier, PieceCopier, staged_chunks
from .dataplane import DataPlane, Medium, PrefillPublisher
from .kv import EngineKV, chunk_parts
from .layerwise import LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult
from .policy import WirePolicy
from .results import StreamChunk, StreamStoreResult
from .stream import (
    Parts,
    Payload,
    PieceReader,
    StreamAssembler,
    StreamPiece,
    message_limit,
    payload_view,
    piece_bytes,
    store_frames,
)

logger = logging.getLogger(__name__)


class ByteStreamPlane(DataPlane):
    """Loads and stores whole chunks over the daemon's byte-stream RPCs."""

    kind = Medium.BYTE_STREAM

    # ------------------------------------------------------------------ load

    def load(self, keys: Sequence[bytes], kv: EngineKV, policy: WirePolicy, prompt_tokens: int) -> LoadResult:
        layout = self.namespace.layout
        parts = chunk_parts(layout, kv)
        sources: dict[TierLevel, int] = {}

        def tally(source: TierLevel | None) -> None:  # a whole chunk, by the tier it came from
            if source is not None:
                sources[source] = sources.get(source, 0) + layout.chunk_tokens

        if parts is not None and layout.chunk_bytes > self._message_limit():
            # chunks in several pieces, into contiguous CPU tensors: each piece straight into them (a chunk
            # in one message is lent whole to the ChunkCopier: one copy too, and fewer, larger copies)
            with PieceCopier(parts, layout.chunk_bytes) as pieces:

                def piece(p: StreamPiece) -> None:
                    pieces.submit(p)
                    if p.last:
                        tally(p.source)

                loaded = self.receive_pieces(keys, piece)
        else:
            with ChunkCopier(layout, kv) as copier:

                def chunk(c: StreamChunk) -> None:
                    copier.submit(c)
                    tally(c.source)

                loaded = self.receive(keys, chunk, buffers=copier.buffer, lend=True)
        hit = loaded * layout.chunk_tokens
        return LoadResult(
            len(keys) * layout.chunk_tokens,
            hit,
            hit,
            remote=True,
            tokens_cached=hit,
            sources=MappingProxyType(sources),
        )

    def load_layerwise(
        self,
        keys: Sequence[bytes],
        kv: EngineKV,
        policy: WirePolicy,
        prompt_tokens: int,
        on_result: Callable[[LoadResult], None],
    ) -> LayerwiseLoad:
        layout = self.namespace.layout
        chunks: list[StreamChunk] = []
        self.receive(keys, chunks.append, reuse_buffer=False)
        hit = len(chunks) * layout.chunk_tokens
        sources: dict[TierLevel, int] = {}
        for c in chunks:
            if c.source is not None:
                sources[c.source] = sources.get(c.source, 0) + layout.chunk_tokens
        planned = LoadResult(
            len(keys) * layout.chunk_tokens,
            hit,
            hit,
            remote=True,
            tokens_cached=hit,
            sources=MappingProxyType(sources),
        )
        views = [(c.index, torch.frombuffer(c.data, dtype=torch.uint8)) for c in chunks]
        return LayerwiseLoad.unleased(layout, kv, planned, on_result, nullcontext(views) if views else None)

    # ------------------------------------------------------------------ store

    def store(self, keys: Sequence[bytes], kv: EngineKV) -> StoreResult:
        layout = self.namespace.layout
        c_tokens = layout.chunk_tokens
        offered = len(keys) * c_tokens
        cached = self.client.lookup(self.namespace, keys).chunks
        if cached >= len(keys):
            return StoreResult(offered, 0, offered, remote=True)
        payloads = _payloads(layout, kv, range(cached, len(keys)))
        result = self.send(keys[cached:], payloads, start_depth=cached, codec=self.config.codec)
        skipped = cached + len(result.skipped)
        return StoreResult(offered, result.stored * c_tokens, skipped * c_tokens, remote=True)

    def begin_save(self, keys: Sequence[bytes], cached: int | None = None) -> LayerwiseSave:
        """Layers are staged in local buffers; the chunks are sent at commit (one StreamStore), but for those
        the daemon holds by then: the commit looks the chunks after ``cached`` up first (a key names its
        whole prefix), so that a chunk another engine stored since ``cached`` was learnt is not sent (one
        small call instead of a chunk's bytes)."""
        layout = self.namespace.layout
        if cached is None:
            cached = self.client.lookup(self.namespace, keys).chunks
        staged = [(i, torch.empty(layout.chunk_bytes, dtype=torch.uint8)) for i in range(cached, len(keys))]

        def commit() -> int:
            held = cached + self.client.lookup(self.namespace, keys[cached:]).chunks if staged else cached
            payloads = (buf for i, buf in staged if i >= held)
            return self.send(keys[held:], payloads, start_depth=held, codec=self.config.codec).stored

        return LayerwiseSave(
            layout, len(keys), nullcontext(staged) if staged else None, commit, lambda: None, cached, True
        )

    def prefill_publisher(self, keys: Sequence[bytes], start: int) -> PrefillPublisher:
        return _StreamPublisher(self, keys)

    # ------------------------------------------------------------------ the two streams

    def send(
        self,
        keys: Sequence[bytes],
        payloads: Iterable[Payload | Parts],
        start_depth: int = 0,
        codec: Codec = Codec.RAW,
    ) -> StreamStoreResult:
        """Store whole chunks over the byte stream; committed when the stream ends.

        Args:
            keys: chunk keys; ``keys[0]`` is at chain depth ``start_depth``.
            payloads: one raw chunk per key, consumed lazily while the stream is sent (or the views of its
                consecutive parts, see :func:`~.kv.chunk_parts`).
            start_depth: chain depth of ``keys[0]``.
            codec: RAW, or ZSTD to compress pieces (level 1) where it pays.

        Raises:
            InvalidArgumentError: a payload of the wrong size (also raised when the engine's payload
                iterator raised: its exception is re-raised as is).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        if not keys:
            return StreamStoreResult(0, ())
        reg = self.client.registration(self.namespace)
        piece = piece_bytes(
            message_limit(reg.max_stream_message_bytes, self.client.config.channel.max_message_bytes)
        )

        def messages(handle: bytes) -> Iterator[Framed[pb.StreamStoreMessage]]:
            views = (p if isinstance(p, tuple) else payload_view(p, i) for i, p in enumerate(payloads))
            return store_frames(handle, keys, views, reg.chunk_bytes, piece, codec, start_depth)

        return self.client.stream_store(self.namespace, messages)

    def receive(
        self,
        keys: Sequence[bytes],
        consume: Callable[[StreamChunk], None],
        reuse_buffer: bool = False,
        buffers: Callable[[], bytearray] | None = None,
        lend: bool = False,
    ) -> int:
        """Receive the contiguous cached prefix of ``keys``, handing each whole chunk to ``consume``.

        With ``reuse_buffer`` every chunk is assembled in the same buffer: ``consume`` must be done with
        ``chunk.data`` when it returns; with ``buffers``, each chunk is assembled in the buffer it gives;
        with ``lend``, a chunk that came whole in one raw message is handed over as a read-only view of that
        message instead (no assembly copy).
        Returns the number of chunks consumed.

        Raises:
            TierCacheError: the stream was malformed (out-of-order pieces, bad sizes or zstd data).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        if not keys:
            return 0
        chunk_bytes = self.client.registration(self.namespace).chunk_bytes

        def read(messages: Iterator[Framed[pb.StreamLoadMessage]]) -> int:
            assembler = StreamAssembler(keys, chunk_bytes, reuse_buffer, buffers, lend)
            count = 0
            for msg in messages:
                chunk = assembler.feed(msg)
                if chunk is not None:
                    consume(chunk)
                    count += 1
            assembler.finish()
            return count

        return self._load_stream(keys, read)

    def receive_pieces(self, keys: Sequence[bytes], consume: Callable[[StreamPiece], None]) -> int:
        """Receive the contiguous cached prefix of ``keys``, handing each checked, decoded piece to
        ``consume`` in order (nothing assembled: a raw piece's data is a view into its message).
        Returns the number of whole chunks, once the stream ended on a chunk boundary; ``consume`` must
        have put a chunk's pieces where they belong by the time it is counted.

        Raises:
            TierCacheError: the stream was malformed (out-of-order pieces, bad sizes or zstd data).
            UnavailableError, DeadlineExceededError, ...: daemon failures.
        """
        if not keys:
            return 0
        chunk_bytes = self.client.registration(self.namespace).chunk_bytes

        def read(messages: Iterator[Framed[pb.StreamLoadMessage]]) -> int:
            reader = PieceReader(keys, chunk_bytes)
            for msg in messages:
                consume(reader.feed(msg))
            return reader.finish()

        return self._load_stream(keys, read)

    def _load_stream(
        self, keys: Sequence[bytes], read: Callable[[Iterator[Framed[pb.StreamLoadMessage]]], int]
    ) -> int:
        """Run a StreamLoad of ``keys`` within both ends' message limit, its messages consumed by ``read``."""
        return self.client.stream_load(
            self.namespace, keys, read, codec=self.config.codec, max_message_bytes=self._message_limit()
        )

    def _message_limit(self) -> int:
        """The largest load message both ends accept (the daemon sends pieces of at most that many bytes)."""
        reg = self.client.registration(self.namespace)
        return message_limit(reg.max_stream_message_bytes, self.client.config.channel.max_message_bytes)


def _payloads(layout: KVLayout, kv: EngineKV, positions: Sequence[int]) -> Iterable[Payload | Parts]:
    """The chunks at ``positions`` to send: views of the engine's memory when every chunk lies there in
    contiguous parts (written to the wire in one copy each), else gathered one ahead on a worker thread.
    """
    parts = chunk_parts(layout, kv)
    if parts is not None:
        return map(parts, positions)
    return staged_chunks(layout, kv, positions)


class _StreamPublisher(PrefillPublisher):
    """Publishes led chunks as one stream store per publication (nothing is reserved in between)."""

    def __init__(self, plane: ByteStreamPlane, keys: Sequence[bytes]) -> None:
        self._plane = plane
        self._keys = keys

    @property
    def reserved(self) -> bool:
        return False

    def publish(self, kv: EngineKV, positions: Sequence[int]) -> int:
        payloads = _payloads(self._plane.namespace.layout, kv, positions)
        keys = [self._keys[p] for p in positions]
        # Publications travel raw, whatever the connector's codec (as they always have).
        return self._plane.send(keys, payloads, start_depth=positions[0]).stored

    def abort(self) -> None:
        return None

"""Framing of the byte-stream data plane (engines on another host): chunks <-> bounded messages.

A chunk travels as pieces of at most ``piece_bytes`` raw bytes, cut, coded and checked by the piece codec
the daemon uses too (:mod:`tiercache.wire.pieces`: per-piece zstd when the codec asks for it and it pays,
``offset`` counting raw bytes), so every message stays within the daemon's ``max_stream_message_bytes``. A
raw piece is never copied here: it is a view of the payload until it is written to the wire, and a
received piece is read from the view into the received message that :func:`~tiercache.wire.framing.split`
gives. This module adds what only the connector needs: payloads given as parts, a store's first message
(handle and key chain), and a load's order (the contiguous cached prefix, chunk after chunk).

Primitives:
    Payload, payload_view: one raw chunk to send (a 1-D CPU uint8 tensor or bytes-like) as a memoryview.
    Parts: one raw chunk as the views of its consecutive parts (sent without joining them).
    message_limit: the message size limit of a stream (the daemon's and the channel's).
    piece_bytes: raw bytes per piece for a message size limit.
    store_frames: the pieces of a store as :class:`~tiercache.wire.framing.Framed` messages, their data
        views of the payloads (written to the wire in one copy).
    store_messages: the same pieces as whole ``StreamStoreMessage`` objects.
    StreamPiece: one checked, decoded piece of a StreamLoad.
    PieceReader: checks the pieces of a StreamLoad in order and decodes them, without assembling them
        (the receiver writes each piece where it belongs, e.g. straight into the engine's KV).
    StreamAssembler: rebuilds whole chunks from ``StreamLoadMessage`` pieces (framed or whole), checking
        every field (with a :class:`PieceReader`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import CODECS, TIERS
from tiercache.wire.framing import BytesLike, Framed
from tiercache.wire.pieces import PieceDecoder, PieceEncoder, cut_parts, piece_header, piece_spans

from .results import StreamChunk

DEFAULT_MESSAGE_BYTES = 4 * 1024 * 1024
"""Message size limit used when the daemon names none."""
_OVERHEAD_BYTES = 512
"""Room left in a message for everything but the data (key, offsets, flags, framing)."""


Payload = torch.Tensor | bytes | bytearray | memoryview
"""One raw chunk for a stream store: a 1-D CPU uint8 tensor or any bytes-like object."""


Parts = tuple[memoryview, ...]
"""One raw chunk as the views of its consecutive parts (e.g. an engine's per-layer K and V)."""


def payload_view(payload: Payload, index: int) -> memoryview:
    """The bytes of one payload, without a copy.

    Raises:
        InvalidArgumentError: naming ``payloads[index]``, for a tensor that is not 1-D uint8 on the CPU.
    """
    if isinstance(payload, torch.Tensor):
        if payload.device.type != "cpu" or payload.dtype != torch.uint8 or payload.dim() != 1:
            raise InvalidArgumentError(f"payloads[{index}]", "must be a 1-D uint8 CPU tensor")
        return payload.contiguous().numpy().data
    return memoryview(payload)


def message_limit(daemon_max_bytes: int, channel_max_bytes: int) -> int:
    """The largest stream message both ends accept: the daemon's limit (0: the default) and the channel's."""
    return min(daemon_max_bytes or DEFAULT_MESSAGE_BYTES, channel_max_bytes)


def piece_bytes(max_message_bytes: int) -> int:
    """Raw bytes per piece so that a message (data plus fields) stays within ``max_message_bytes``.

    Raises:
        InvalidArgumentError: the limit leaves no room for data.
    """
    limit = max_message_bytes or DEFAULT_MESSAGE_BYTES
    if limit <= _OVERHEAD_BYTES:
        raise InvalidArgumentError(
            "max_message_bytes", f"{limit} leaves no room for data (need > {_OVERHEAD_BYTES})"
        )
    return limit - _OVERHEAD_BYTES


def _flat(view: memoryview) -> memoryview:
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def store_frames(
    handle: bytes,
    keys: Sequence[bytes],
    payloads: Iterable[memoryview | Parts],
    chunk_bytes: int,
    max_piece_bytes: int,
    codec: Codec = Codec.RAW,
    start_depth: int = 0,
) -> Iterator[Framed[pb.StreamStoreMessage]]:
    """The pieces of a stream store, in order; the first carries the handle and the whole key chain (the
    daemon reserves every chunk in one call, and refuses the stream if the pieces do not match the keys).

    A raw piece's data is a view of its payload: it must be written to the wire (gRPC serializes each
    request before it asks for the next) before the payload's buffer is reused for the next chunk.

    Args:
        handle: the namespace handle.
        keys: chunk keys; ``index`` in the messages is the position in ``keys``.
        payloads: one raw chunk (``chunk_bytes`` bytes) per key, produced lazily: one view, or the views of
            its consecutive parts (:data:`Parts`), written to the wire in one copy each, never joined here.
        chunk_bytes: raw bytes of a chunk.
        max_piece_bytes: raw bytes per piece (see :func:`piece_bytes`).
        codec: RAW, or ZSTD to compress pieces where it pays.
        start_depth: chain depth of ``keys[0]``.

    Raises:
        InvalidArgumentError: naming ``payloads[i]``, when a payload has the wrong size; or ``payloads``
            when their number differs from the keys'.
    """
    encoder = PieceEncoder(codec)
    first = True
    count = 0
    for index, (key, payload) in enumerate(zip(keys, payloads)):
        count += 1
        parts = tuple(map(_flat, payload)) if isinstance(payload, tuple) else (_flat(payload),)
        nbytes = sum(part.nbytes for part in parts)
        if nbytes != chunk_bytes:
            raise InvalidArgumentError(f"payloads[{index}]", f"has {nbytes} bytes, need {chunk_bytes}")
        for start, stop in piece_spans(chunk_bytes, max_piece_bytes):
            piece = encoder.encode(cut_parts(parts, start, stop))
            header = piece_header(pb.StreamStoreMessage, key, index, start, stop, chunk_bytes, piece.codec)
            if first:
                header.handle = handle
                header.start_depth = start_depth
                header.keys.extend(keys)
                first = False
            yield Framed(header, piece.data, piece.more)
    if count != len(keys):
        raise InvalidArgumentError("payloads", f"{count} payloads for {len(keys)} keys")


def store_messages(
    handle: bytes,
    keys: Sequence[bytes],
    payloads: Iterable[memoryview],
    chunk_bytes: int,
    max_piece_bytes: int,
    codec: Codec = Codec.RAW,
    start_depth: int = 0,
) -> Iterator[pb.StreamStoreMessage]:
    """The pieces of :func:`store_frames` as whole messages (each data copied into its message)."""
    for frame in store_frames(handle, keys, payloads, chunk_bytes, max_piece_bytes, codec, start_depth):
        yield frame.message()


@dataclass(frozen=True, slots=True)
class StreamPiece:
    """One piece of a StreamLoad that passed every check.

    Attributes:
        index: the chunk's position in the request's keys.
        key: the chunk key.
        offset: raw offset of ``data`` in the chunk.
        data: the raw (decoded) bytes: a view into the received message for a raw piece (it keeps the
            message alive), else the decompressed bytes.
        in_message: ``data`` is a view into the received message (a raw piece), not decoded bytes.
        last: the chunk's last piece: with it, the chunk's pieces covered exactly ``chunk_bytes``.
        source: the tier the chunk's bytes came from (None: the daemon did not say).
    """

    index: int
    key: bytes
    offset: int
    data: BytesLike
    in_message: bool
    last: bool
    source: TierLevel | None = None


class PieceReader:
    """Checks the pieces of a StreamLoad, in order, and decodes them; assembles nothing.

    The daemon sends the contiguous cached prefix: chunk 0, 1, 2, ... each as consecutive pieces. A piece
    is returned only once it is known to be in order, to name the request's key and chunk size, and to fit
    within its chunk (a piece that would overflow it is refused before any byte of it is used); a chunk is
    whole only when its last piece is returned, and :meth:`finish` refuses a stream that stopped inside a
    chunk. A receiver that writes pieces where they belong must count a chunk only once its last piece
    has been written.
    """

    def __init__(self, keys: Sequence[bytes], chunk_bytes: int) -> None:
        """Args:
        keys: the request's keys.
        chunk_bytes: raw bytes per chunk.
        """
        self._keys = keys
        self._chunk_bytes = chunk_bytes
        self._decoder = PieceDecoder(chunk_bytes)
        self._next_index = 0
        self._open = False
        self._filled = 0

    def _fail(self, message: str) -> TierCacheError:
        return TierCacheError(f"stream load: {message}")

    def feed(self, piece: pb.StreamLoadMessage | Framed[pb.StreamLoadMessage]) -> StreamPiece:
        """Check and decode one message (whole, or framed with its data apart).

        Raises:
            TierCacheError: a message is out of order, names the wrong key or size, overflows its chunk,
                ends its chunk short, or fails to decode.
        """
        msg, data = (piece.header, piece.data) if isinstance(piece, Framed) else (piece, piece.data)
        if not self._open:
            if msg.index != self._next_index or msg.index >= len(self._keys):
                raise self._fail(f"chunk {msg.index} arrived, expected {self._next_index}")
            if msg.offset != 0:
                raise self._fail(f"chunk {msg.index} starts at offset {msg.offset}")
            self._open = True
            self._filled = 0
        elif msg.index != self._next_index:
            raise self._fail(f"chunk {msg.index} interleaved with unfinished chunk {self._next_index}")
        self._check_chunk(msg)
        if msg.offset != self._filled:
            raise self._fail(f"chunk {msg.index}: piece at offset {msg.offset}, expected {self._filled}")
        codec = CODECS.lookup(msg.codec)
        if codec is None:
            raise self._fail(f"chunk {msg.index}: unknown codec {msg.codec}")
        start = self._filled
        try:
            raw = self._decoder.decode(msg.index, start, data, codec, msg.last)
        except InvalidArgumentError as exc:
            raise self._fail(str(exc)) from None
        self._filled = start + raw.nbytes
        if msg.last:
            self._open = False
            self._next_index += 1
        source = TIERS.lookup(msg.source)
        return StreamPiece(msg.index, self._keys[msg.index], start, raw, codec is Codec.RAW, msg.last, source)

    def _check_chunk(self, msg: pb.StreamLoadMessage) -> None:
        """The message's chunk size and key (when it names them) are the request's."""
        if msg.chunk_bytes and msg.chunk_bytes != self._chunk_bytes:
            raise self._fail(
                f"chunk {msg.index} has {msg.chunk_bytes} bytes, the layout needs {self._chunk_bytes}"
            )
        if msg.key and msg.key != self._keys[msg.index]:
            raise self._fail(f"chunk {msg.index} carries another key")

    def finish(self) -> int:
        """Check that the stream did not stop inside a chunk; returns the number of whole chunks.

        Raises:
            TierCacheError: the last chunk is incomplete.
        """
        if self._open:
            raise self._fail(f"stream ended inside chunk {self._next_index}")
        return self._next_index


class StreamAssembler:
    """Rebuilds whole chunks from the pieces of a StreamLoad, in order, validating each message (with a
    :class:`PieceReader`)."""

    def __init__(
        self,
        keys: Sequence[bytes],
        chunk_bytes: int,
        reuse_buffer: bool = False,
        buffers: Callable[[], bytearray] | None = None,
        lend: bool = False,
    ) -> None:
        """Args:
        keys: the request's keys.
        chunk_bytes: raw bytes per chunk.
        reuse_buffer: assemble every chunk in one buffer (the caller is done with a chunk's ``data``
            before it feeds the next message): a fresh multi-MiB buffer per chunk costs a page fault per
            4 KiB on first touch, several times the copy itself.
        buffers: where each chunk is assembled instead (``chunk_bytes`` long; e.g. the rotating buffers
            of a :class:`~.copier.ChunkCopier`).
        lend: a chunk that arrives whole in one raw piece is not assembled: its ``data`` is a read-only
            view of the received message (which it keeps alive), and no buffer is taken for it.
        """
        self._reader = PieceReader(keys, chunk_bytes)
        self._lend = lend
        self._buffers = buffers
        self._chunk_bytes = chunk_bytes
        self._buffer: bytearray | None = None
        self._spare: bytearray | None = None
        self._reuse = reuse_buffer

    def _new_buffer(self) -> bytearray:
        if self._buffers is not None:
            buf = self._buffers()
            if len(buf) != self._chunk_bytes:
                raise ValueError(f"buffers gave {len(buf)} bytes for {self._chunk_bytes}-byte chunks")
            return buf
        return self._spare if self._spare is not None else bytearray(self._chunk_bytes)

    def feed(self, piece: pb.StreamLoadMessage | Framed[pb.StreamLoadMessage]) -> StreamChunk | None:
        """Take one message (whole, or framed with its data apart); returns the chunk it completes, else None.

        Raises:
            TierCacheError: a message is out of order, names the wrong key or size, or fails to decode.
        """
        got = self._reader.feed(piece)
        if self._buffer is None:
            if self._lend and got.in_message and got.last and got.offset == 0:
                return StreamChunk(got.index, got.key, memoryview(got.data).toreadonly(), got.source)
            self._buffer = self._new_buffer()
        stop = got.offset + memoryview(got.data).nbytes
        # numpy copies without holding the GIL (gRPC's receiving thread runs meanwhile)
        np.frombuffer(self._buffer, dtype=np.uint8)[got.offset : stop] = np.frombuffer(
            got.data, dtype=np.uint8
        )
        if not got.last:
            return None
        chunk = StreamChunk(got.index, got.key, self._buffer, got.source)
        if self._reuse:
            self._spare = self._buffer
        self._buffer = None
        return chunk

    def finish(self) -> int:
        """Check that the stream did not stop inside a chunk; returns the number of whole chunks.

        Raises:
            TierCacheError: the last chunk is incomplete.
        """
        return self._reader.finish()

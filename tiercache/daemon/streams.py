"""The daemon's end of the byte-stream data plane: the pieces of a StreamStore checked and written into slots.

A chunk travels as one or more pieces ``(key, index, offset, data, codec, last, chunk_bytes)``, cut, coded
and decoded by the piece codec the connector uses too (:mod:`tiercache.wire.pieces`). :class:`ChunkAssembler`
checks every piece of a StreamStore against the namespace's layout (and against the key chain the stream
named up front, when it did) and writes the decoded bytes straight into the buffer reserved for the chunk (a
shared-memory slot), so a chunk is never staged in an extra buffer, and hashes each block as it lands (the
commit takes those checksums instead of reading the slots again); :func:`load_piece` makes one piece of a
StreamLoad. Both are synchronous: the servicer runs large pieces in its executor.

Pieces travel framed (:mod:`tiercache.wire.framing`): a StreamStore piece's data is a view into the
received message and is copied once, into the slot; a raw StreamLoad piece's data is a view of the leased
slot, copied once, when gRPC writes the message (before the handler resumes, so within the lease).

Primitives:
    Piece: a validated piece of a StreamStore.
    ChunkAssembler: ``check`` a message, ``open`` the chunk's buffer, ``write`` a piece, ``finish``.
    load_piece: one framed StreamLoad piece of a leased chunk.
    STREAM_CODECS: the wire codecs of StreamStore and StreamLoad (framed pieces).
    INLINE_BYTES, INLINE_COPY_BYTES: zstd / raw pieces at most this large are handled on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tiercache.checksum import Hasher
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.tiers.base import TierLevel
from tiercache.wire import CODECS, tier_to_proto
from tiercache.wire.framing import BytesLike, Framed, split
from tiercache.wire.pieces import PieceDecoder, PieceEncoder, piece_header

from .convert import check_key_field
from .decode import WireCodec

INLINE_BYTES = 256 << 10
"""zstd pieces up to this size are coded inline; larger ones go to the executor."""
INLINE_COPY_BYTES = 1 << 20
"""Raw StreamStore pieces up to this size are copied inline: the hand-off to the executor (a queue put that
wakes a worker, which takes the GIL) costs more than the copy of a 512 KiB piece (a stream store of 512 KiB
pieces on a 2-core host: ~0.5 GB/s through the executor, ~0.85 GB/s inline; 4 MiB pieces: no difference)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A StreamStore message that passed the stream-level checks.

    Attributes:
        starts_chunk: the first piece of a new chunk (the caller reserves its buffer first).
        key: the chunk key.
        index: the chunk's position in the caller's chain (``start_depth + index`` is its depth).
        offset: raw offset of the data in the chunk.
        data: the message's data as sent (a view into the received message).
        zstd: whether ``data`` is a zstd frame.
        last: the chunk's last piece.
    """

    starts_chunk: bool
    key: bytes
    index: int
    offset: int
    data: BytesLike
    zstd: bool
    last: bool


class ChunkAssembler:
    """Validates the pieces of one StreamStore and writes them into the chunks' buffers."""

    def __init__(self, chunk_bytes: int, chain: Sequence[bytes] | None = None) -> None:
        """Args:
        chunk_bytes: raw size of every chunk (from the namespace's layout).
        chain: the keys the stream's first message named (its field ``keys``), None when it named none:
            the stream must then send exactly these chunks, index 0, 1, ... each with its key.
        """
        self._chunk_bytes = chunk_bytes
        self._chain = chain
        self._key: bytes | None = None  # the open chunk, None between chunks
        self._index = -1
        self._received = 0
        self._target: np.ndarray | None = None  # None: the chunk is skipped (its bytes are dropped)
        self._hasher: Hasher | None = None
        self._messages = 0
        self._decoder = PieceDecoder(chunk_bytes)
        self.checksums: dict[int, int] = {}
        """Chunk index -> the xxh3-64 of the bytes written into its buffer, once its last piece is written
        (each block hashed as it landed: the commit need not read the slot again)."""

    @property
    def open_index(self) -> int | None:
        """Index of the chunk being received, None between chunks."""
        return self._index if self._key is not None else None

    def check(self, piece: Framed[pb.StreamStoreMessage]) -> Piece:
        """Validate a message against the stream so far.

        Raises:
            InvalidArgumentError: naming the field (``key``, ``index``, ``offset``, ``chunk_bytes``, ``codec``,
                ``keys``).
        """
        msg, data = piece.header, piece.data
        n = self._messages
        self._messages += 1
        zstd = CODECS.from_proto(int(msg.codec), "codec") is Codec.ZSTD
        if msg.chunk_bytes != self._chunk_bytes:
            raise InvalidArgumentError(
                "chunk_bytes",
                f"{msg.chunk_bytes} (message {n}), the namespace's layout needs {self._chunk_bytes}",
            )
        if self._key is None:
            key = check_key_field(msg.key, "key")
            if self._chain is not None:
                self._check_chained(self._chain, key, msg.index, n)
            if msg.index <= self._index:
                raise InvalidArgumentError(
                    "index", f"{msg.index} (message {n}) is not after the previous chunk's {self._index}"
                )
            if msg.offset != 0:
                raise InvalidArgumentError(
                    "offset",
                    f"a chunk's first piece starts at 0, got {msg.offset} (message {n}, index {msg.index})",
                )
            return Piece(True, key, msg.index, 0, data, zstd, msg.last)
        if msg.key != self._key or msg.index != self._index:
            raise InvalidArgumentError(
                "key" if msg.key != self._key else "index",
                f"message {n} is not a piece of chunk index {self._index}, which has {self._received} of "
                f"{self._chunk_bytes} bytes (finish a chunk with last=true before the next)",
            )
        if msg.offset != self._received:
            raise InvalidArgumentError(
                "offset", f"expected {self._received}, got {msg.offset} (message {n}, index {self._index})"
            )
        return Piece(False, self._key, self._index, msg.offset, data, zstd, msg.last)

    def _check_chained(self, chain: Sequence[bytes], key: bytes, index: int, n: int) -> None:
        """A new chunk of a stream that named its keys: the next index of the chain, with its key."""
        expected = self._index + 1
        if expected >= len(chain):
            raise InvalidArgumentError(
                "keys", f"the first message names {len(chain)} chunks; message {n} starts another"
            )
        if index != expected:
            raise InvalidArgumentError(
                "index", f"{index} (message {n}): the first message's keys make chunk {expected} the next"
            )
        if key != chain[index]:
            raise InvalidArgumentError(
                "key", f"message {n}: chunk index {index}'s key is not keys[{index}] of the first message"
            )

    def open(self, piece: Piece, buffer: torch.Tensor | None) -> None:
        """Start the chunk of a first piece; ``buffer`` is its reserved memory, None when it is skipped."""
        self._key, self._index, self._received = piece.key, piece.index, 0
        self._target = None if buffer is None else buffer.numpy()
        self._hasher = None if buffer is None else Hasher()

    def write(self, piece: Piece) -> None:
        """Decode a piece into the open chunk's buffer (thread-safe with respect to the event loop).

        Raises:
            InvalidArgumentError: ``data`` does not decode or overruns the chunk, or the chunk's last piece
                leaves it short.
        """
        codec = Codec.ZSTD if piece.zstd else Codec.RAW
        data = self._decoder.decode(piece.index, piece.offset, piece.data, codec, piece.last)
        end = piece.offset + data.nbytes
        if self._target is not None and self._hasher is not None and data:
            self._hasher.copy_in(memoryview(self._target[piece.offset : end]), data)  # type: ignore[arg-type]
        self._received = end
        if piece.last:
            if self._hasher is not None:
                self.checksums[piece.index] = self._hasher.intdigest()
            self._key, self._target, self._hasher = None, None, None

    def finish(self) -> None:
        """Check that the stream did not end inside a chunk, nor before every chunk its keys named.

        Raises:
            InvalidArgumentError: naming ``last`` or ``keys``.
        """
        if self._key is not None:
            raise InvalidArgumentError(
                "last",
                f"the stream ended inside chunk index {self._index} after {self._received} of "
                f"{self._chunk_bytes} bytes",
            )
        if self._chain is not None and self._index + 1 != len(self._chain):
            raise InvalidArgumentError(
                "keys",
                f"the first message names {len(self._chain)} chunks, the stream sent {self._index + 1}",
            )


def load_piece(
    encoder: PieceEncoder,
    key: bytes,
    index: int,
    view: torch.Tensor,
    start: int,
    stop: int,
    chunk_bytes: int,
    source: TierLevel,
) -> Framed[pb.StreamLoadMessage]:
    """The piece ``[start, stop)`` of the ``chunk_bytes`` chunk ``index`` (its bytes ``view``: a leased 1-D
    uint8 CPU view, brought from ``source``, which the piece names so that the engine can report what it
    loaded from where).

    A raw piece's data is a view of ``view``, valid while the lease is held: write it before releasing.
    """
    piece = encoder.encode([view[start:stop].numpy().data])
    header = piece_header(pb.StreamLoadMessage, key, index, start, stop, chunk_bytes, piece.codec)
    header.source = tier_to_proto(source)
    return Framed(header, piece.data)


def _write_load_piece(piece: Framed[pb.StreamLoadMessage]) -> bytes:
    return piece.serialize()


def _parse_store_piece(raw: bytes) -> Framed[pb.StreamStoreMessage]:
    return split(raw, pb.StreamStoreMessage)


STREAM_CODECS = {
    "StreamStore": WireCodec(_parse_store_piece, pb.StreamStoreResponse.SerializeToString),
    "StreamLoad": WireCodec(pb.StreamLoadRequest.FromString, _write_load_piece),
}
"""Method name -> its wire codec: StreamStore pieces arrive and StreamLoad pieces leave framed."""

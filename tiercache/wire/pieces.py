"""The byte-stream piece codec, one for both ends: a chunk's raw bytes <-> the pieces that carry them.

A chunk of ``chunk_bytes`` raw bytes travels over StreamStore and StreamLoad as consecutive pieces, each a
message ``(key, index, offset, codec, last, chunk_bytes)`` plus its data (written and read without
protobuf's copies: :mod:`.framing`). ``offset`` counts raw bytes, ``last`` marks the chunk's final piece.
A piece is zstd-compressed on its own (level :data:`ZSTD_LEVEL`) only when the sender was asked for zstd
and the frame is smaller than the raw bytes; otherwise its data is a view of the sender's memory, never
copied until it is written to the wire. The daemon (sending loads, receiving stores) and the connector
(the other way round) cut, code and check pieces with these same functions; the order in which each end
accepts chunks (a store's key chain, a load's contiguous prefix) stays with that end.

Primitives:
    ZSTD_LEVEL: the zstd level of pieces.
    piece_spans: the raw ``(start, stop)`` of each piece of a chunk.
    cut_parts: the bytes ``[start, stop)`` of a chunk given as consecutive parts, as views of them.
    EncodedPiece, PieceEncoder: one piece's data (its first part and the parts written after it) and codec.
    piece_header: the small fields of a piece message (``StreamStoreMessage`` or ``StreamLoadMessage``).
    PieceDecoder: one received piece's raw bytes, checked to fit its chunk and, when last, to complete it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import zstandard
from google.protobuf.message import Message

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.wire.enums import CODECS
from tiercache.wire.framing import BytesLike

M = TypeVar("M", bound=Message)

ZSTD_LEVEL = 1
"""zstd level of a compressed piece (fast: the stream is meant to beat recompute)."""


def piece_spans(chunk_bytes: int, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """The raw ``(start, stop)`` of each piece of a ``chunk_bytes`` chunk cut every ``piece_bytes`` bytes."""
    for start in range(0, chunk_bytes, piece_bytes):
        yield start, min(start + piece_bytes, chunk_bytes)


def cut_parts(parts: Sequence[memoryview], start: int, stop: int) -> list[memoryview]:
    """The bytes ``[start, stop)`` of the concatenation of ``parts``, as views of them (no copy; fewer
    bytes than asked for where the parts end first)."""
    out: list[memoryview] = []
    pos = 0
    for part in parts:
        end = pos + part.nbytes
        if end > start and pos < stop:
            out.append(part[max(start - pos, 0) : min(stop, end) - pos])
        if end >= stop:
            break
        pos = end
    return out


@dataclass(frozen=True, slots=True)
class EncodedPiece:
    """One piece ready for the wire.

    Attributes:
        data: the piece's data (a view of the sender's memory when raw), written first.
        more: further raw parts written after ``data`` in the same data field (empty when compressed).
        codec: RAW or ZSTD.
    """

    data: BytesLike
    more: tuple[BytesLike, ...]
    codec: Codec


class PieceEncoder:
    """Encodes pieces for a stream that asked for ``codec`` (RAW: every piece raw). Not thread-safe."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL) if codec is Codec.ZSTD else None

    def encode(self, raw: Sequence[BytesLike]) -> EncodedPiece:
        """A piece whose raw bytes are the concatenation of ``raw`` (at least one part): zstd when asked for
        and smaller, else the parts themselves."""
        if self._zstd is not None:
            whole = raw[0] if len(raw) == 1 else b"".join(raw)
            packed = self._zstd.compress(whole)
            if len(packed) < memoryview(whole).nbytes:
                return EncodedPiece(packed, (), Codec.ZSTD)
        return EncodedPiece(raw[0], tuple(raw[1:]), Codec.RAW)


def piece_header(
    message_type: Callable[..., M],
    key: bytes,
    index: int,
    start: int,
    stop: int,
    chunk_bytes: int,
    codec: Codec,
) -> M:
    """The small fields of the piece ``[start, stop)`` of chunk ``index`` (``last`` when it ends the chunk)."""
    return message_type(
        key=key,
        index=index,
        offset=start,
        codec=CODECS.to_proto(codec),
        last=stop == chunk_bytes,
        chunk_bytes=chunk_bytes,
    )


class PieceDecoder:
    """Decodes received pieces of ``chunk_bytes`` chunks. Not thread-safe (one per stream)."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._zstd = zstandard.ZstdDecompressor()

    def decode(self, index: int, offset: int, data: BytesLike, codec: Codec, last: bool) -> memoryview:
        """The raw bytes of the piece at raw ``offset`` of chunk ``index`` (a view of ``data`` when raw).

        A zstd piece never decodes to more than the room left in its chunk (a frame that declares more is
        refused before it is decompressed), so no piece can make the receiver allocate more than a chunk.

        Raises:
            InvalidArgumentError: naming ``data``: not a zstd frame that fits, more bytes than the chunk has
                room for, or a last piece that leaves the chunk short.
        """
        room = self.chunk_bytes - offset
        raw = memoryview(data)
        if codec is Codec.ZSTD and raw.nbytes:
            if room <= 0:
                raise InvalidArgumentError("data", f"chunk index {index} is already complete")
            try:
                declared = zstandard.frame_content_size(raw)  # -1: not declared (then bounded by room)
                if declared > room:  # zstd would allocate what the frame declares: refuse it first
                    raise InvalidArgumentError(
                        "data",
                        f"chunk index {index} overruns: {offset + declared} bytes, the layout needs "
                        f"{self.chunk_bytes}",
                    )
                raw = memoryview(self._zstd.decompress(raw, max_output_size=room))
            except zstandard.ZstdError as exc:
                raise InvalidArgumentError(
                    "data",
                    f"chunk index {index} at offset {offset}: not a zstd frame of <= {room} bytes ({exc})",
                ) from None
        end = offset + raw.nbytes
        if end > self.chunk_bytes:
            raise InvalidArgumentError(
                "data", f"chunk index {index} overruns: {end} bytes, the layout needs {self.chunk_bytes}"
            )
        if last and end != self.chunk_bytes:
            raise InvalidArgumentError(
                "data", f"chunk index {index} ended at {end} bytes, the layout needs {self.chunk_bytes}"
            )
        return raw

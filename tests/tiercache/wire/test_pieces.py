"""The byte-stream piece codec both ends use: spans, encoding (zstd only where it pays), decoding and its
checks, and headers whose wire bytes are protobuf's own."""

from __future__ import annotations

import pytest
import zstandard

from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire.framing import Framed, split
from tiercache.wire.pieces import (
    ZSTD_LEVEL,
    PieceDecoder,
    PieceEncoder,
    cut_parts,
    piece_header,
    piece_spans,
)

KEY = b"k" * 32


def test_spans_cover_the_chunk_in_order() -> None:
    assert list(piece_spans(10, 4)) == [(0, 4), (4, 8), (8, 10)]
    assert list(piece_spans(8, 8)) == [(0, 8)]
    assert list(piece_spans(8, 100)) == [(0, 8)]


def test_cut_parts_views_the_parts() -> None:
    parts = [memoryview(b"abc"), memoryview(b"defg"), memoryview(b"h")]
    assert [bytes(p) for p in cut_parts(parts, 2, 6)] == [b"c", b"def"]
    assert [bytes(p) for p in cut_parts(parts, 0, 8)] == [b"abc", b"defg", b"h"]
    assert cut_parts(parts, 1, 2)[0].obj is parts[0].obj  # a view, not a copy


def test_raw_pieces_are_views_and_zstd_only_where_it_pays() -> None:
    raw = memoryview(bytes(range(256)) * 4)
    plain = PieceEncoder(Codec.RAW).encode([raw[:512], raw[512:]])
    assert plain.codec is Codec.RAW and plain.data.obj is raw.obj and len(plain.more) == 1
    packed = PieceEncoder(Codec.ZSTD).encode([memoryview(b"\0" * 4096)])
    assert packed.codec is Codec.ZSTD and packed.more == ()
    assert zstandard.ZstdDecompressor().decompress(packed.data, max_output_size=4096) == b"\0" * 4096
    noise = memoryview(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(bytes(range(256)) * 64))
    assert PieceEncoder(Codec.ZSTD).encode([noise]).codec is Codec.RAW  # does not shrink: sent raw


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_encode_decode_round_trip_through_the_wire(codec: Codec) -> None:
    chunk = bytes(100) + bytes(range(200)) * 3
    encoder, decoder = PieceEncoder(codec), PieceDecoder(len(chunk))
    rebuilt = bytearray()
    for start, stop in piece_spans(len(chunk), 128):
        piece = encoder.encode([memoryview(chunk)[start:stop]])
        header = piece_header(pb.StreamLoadMessage, KEY, 3, start, stop, len(chunk), piece.codec)
        wire = Framed(header, piece.data, piece.more).serialize()
        got = split(wire, pb.StreamLoadMessage)
        assert (got.header.index, got.header.offset, got.header.last) == (3, start, stop == len(chunk))
        rebuilt += decoder.decode(3, start, got.data, Codec(codec_of(got.header)), got.header.last)
    assert bytes(rebuilt) == chunk


def codec_of(header: pb.StreamLoadMessage) -> Codec:
    return Codec.ZSTD if header.codec == pb.CODEC_ZSTD else Codec.RAW


def test_header_wire_bytes_are_protobufs_own() -> None:
    data = b"x" * 40
    header = piece_header(pb.StreamStoreMessage, KEY, 1, 64, 104, 104, Codec.RAW)
    whole = pb.StreamStoreMessage(
        key=KEY, index=1, offset=64, codec=pb.CODEC_RAW, last=True, chunk_bytes=104, data=data
    )
    assert pb.StreamStoreMessage.FromString(Framed(header, data).serialize()) == whole
    whole.ClearField("data")
    assert header.SerializeToString() == whole.SerializeToString()  # the data field is appended after


@pytest.mark.parametrize(
    ("offset", "data", "codec", "last", "match"),
    [
        (0, b"a" * 11, Codec.RAW, True, "chunk index 0 overruns: 11 bytes"),
        (4, b"a" * 7, Codec.RAW, False, "overruns"),
        (0, b"a" * 9, Codec.RAW, True, "chunk index 0 ended at 9 bytes"),
        (0, b"not zstd at all", Codec.ZSTD, True, "not a zstd frame of <= 10 bytes"),
        (0, zstandard.ZstdCompressor().compress(b"a" * 20), Codec.ZSTD, True, "overruns: 20 bytes"),
        (0, zstandard.ZstdCompressor().compress(b"a" * (1 << 20)), Codec.ZSTD, True, "overruns"),
        (10, zstandard.ZstdCompressor().compress(b"a"), Codec.ZSTD, True, "already complete"),
    ],
)
def test_decode_refuses_what_does_not_fit(
    offset: int, data: bytes, codec: Codec, last: bool, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match) as info:
        PieceDecoder(10).decode(0, offset, data, codec, last)
    assert info.value.field == "data"


def test_a_raw_piece_decodes_to_a_view_of_its_message() -> None:
    data = memoryview(bytearray(b"abcdefghij"))
    assert PieceDecoder(10).decode(0, 0, data, Codec.RAW, True).obj is data.obj

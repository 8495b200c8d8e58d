"""Byte-stream framing: bounded pieces, per-piece zstd, strict reassembly."""

from __future__ import annotations

import os
from itertools import pairwise

import pytest
import zstandard

from tiercache.codec import Codec
from tiercache.connector.stream import (
    PieceReader,
    StreamAssembler,
    piece_bytes,
    store_frames,
    store_messages,
)
from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire.framing import Framed, split

KEYS = [bytes([i]) * 32 for i in range(3)]
CHUNK = 10_000


def _payloads(compressible: bool) -> list[bytes]:
    if compressible:
        return [bytes([i]) * (CHUNK // 2) + os.urandom(CHUNK // 2) for i in range(3)]
    return [os.urandom(CHUNK) for _ in range(3)]


def _as_load(msg: pb.StreamStoreMessage) -> pb.StreamLoadMessage:
    return pb.StreamLoadMessage(
        index=msg.index,
        key=msg.key,
        offset=msg.offset,
        data=msg.data,
        codec=msg.codec,
        last=msg.last,
        chunk_bytes=msg.chunk_bytes,
    )


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
@pytest.mark.parametrize("compressible", [True, False])
def test_round_trip_within_the_message_limit(codec: Codec, compressible: bool) -> None:
    payloads = _payloads(compressible)
    limit = 3000
    msgs = list(
        store_messages(b"h" * 16, KEYS, map(memoryview, payloads), CHUNK, piece_bytes(limit), codec, 4)
    )
    assert msgs[0].handle == b"h" * 16 and msgs[0].start_depth == 4
    assert all(not m.handle for m in msgs[1:])
    assert all(m.ByteSize() <= limit for m in msgs)
    used = {m.codec for m in msgs}
    if codec is Codec.RAW or not compressible:
        assert used == {pb.CODEC_RAW}  # incompressible pieces travel raw even under zstd
    else:
        assert pb.CODEC_ZSTD in used
    asm = StreamAssembler(KEYS, CHUNK)
    chunks = [c for m in msgs if (c := asm.feed(_as_load(m))) is not None]
    assert asm.finish() == 3
    assert [c.index for c in chunks] == [0, 1, 2]
    assert [bytes(c.data) for c in chunks] == payloads
    assert [c.key for c in chunks] == KEYS


def test_payload_size_and_count_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"payloads\[1\]"):
        list(store_messages(b"h", KEYS, [memoryview(b"x" * CHUNK), memoryview(b"x")], CHUNK, 4096))
    with pytest.raises(InvalidArgumentError, match=r"^payloads:"):
        list(store_messages(b"h", KEYS, [memoryview(b"x" * CHUNK)], CHUNK, 4096))
    with pytest.raises(InvalidArgumentError, match="max_message_bytes"):
        piece_bytes(100)
    assert piece_bytes(0) > 1 << 20  # 0: the default limit


def _msg(
    index: int = 0, offset: int = 0, data: bytes = b"a" * 10, last: bool = True, **kw: object
) -> pb.StreamLoadMessage:
    return pb.StreamLoadMessage(
        index=index, key=KEYS[index], offset=offset, data=data, last=last, chunk_bytes=10, **kw
    )  # type: ignore[arg-type]


MALFORMED = [
    ([_msg(index=1)], "chunk 1 arrived, expected 0"),
    ([_msg(offset=4)], "starts at offset 4"),
    ([_msg(data=b"a" * 4, last=False), _msg(offset=5, data=b"a" * 6)], "offset 5, expected 4"),
    ([_msg(data=b"a" * 4, last=False), _msg(index=1, offset=4, data=b"a" * 6)], "interleaved"),
    ([_msg(data=b"a" * 11)], "overruns"),
    ([_msg(data=b"a" * 9)], "ended at 9 bytes"),
    (
        [pb.StreamLoadMessage(index=0, key=KEYS[1], data=b"a" * 10, last=True, chunk_bytes=10)],
        "another key",
    ),
    ([pb.StreamLoadMessage(index=0, key=KEYS[0], data=b"a" * 10, last=True, chunk_bytes=12)], "12 bytes"),
    ([_msg(data=b"not zstd at all", codec=pb.CODEC_ZSTD)], "not a zstd frame"),
    (
        [_msg(data=zstandard.ZstdCompressor().compress(b"a" * 20), codec=pb.CODEC_ZSTD)],
        "not a zstd frame|overruns",
    ),
]


@pytest.mark.parametrize(("msgs", "match"), MALFORMED)
@pytest.mark.parametrize("lend", [False, True])
def test_malformed_streams_are_rejected(msgs: list[pb.StreamLoadMessage], match: str, lend: bool) -> None:
    asm = StreamAssembler(KEYS, 10, lend=lend)
    with pytest.raises(TierCacheError, match=match):
        for m in msgs:
            asm.feed(m)


@pytest.mark.parametrize(("msgs", "match"), MALFORMED)
def test_a_piece_reader_hands_out_no_piece_of_a_malformed_stream(
    msgs: list[pb.StreamLoadMessage], match: str
) -> None:
    reader = PieceReader(KEYS, 10)
    handed = [reader.feed(m) for m in msgs[:-1]]  # the pieces before the bad one are fine
    with pytest.raises(TierCacheError, match=match):
        reader.feed(msgs[-1])
    assert all(not p.last for p in handed)  # no chunk of a malformed stream was ever complete


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_a_piece_reader_hands_out_each_piece_in_place_with_its_raw_offset(codec: Codec) -> None:
    payloads = _payloads(True)
    stored = store_messages(b"h" * 16, KEYS, map(memoryview, payloads), CHUNK, 3000, codec)
    raw = [_as_load(m).SerializeToString() for m in stored]  # as the connector receives them
    reader = PieceReader(KEYS, CHUNK)
    pieces = [reader.feed(split(r, pb.StreamLoadMessage)) for r in raw]
    assert reader.finish() == 3
    rebuilt = [bytearray(CHUNK) for _ in KEYS]
    for p, message in zip(pieces, raw):
        rebuilt[p.index][p.offset : p.offset + len(memoryview(p.data))] = p.data
        if p.in_message:  # a raw piece: a view into its message, never copied
            assert memoryview(p.data).obj is message
    assert [bytes(b) for b in rebuilt] == payloads
    assert [p.index for p in pieces if p.last] == [0, 1, 2] and [p.key for p in pieces if p.last] == KEYS
    assert codec is Codec.ZSTD or all(p.in_message for p in pieces)
    inside = PieceReader(KEYS, CHUNK)
    inside.feed(split(raw[0], pb.StreamLoadMessage))
    with pytest.raises(TierCacheError, match="inside chunk 0"):
        inside.finish()


def test_stream_that_stops_inside_a_chunk() -> None:
    asm = StreamAssembler(KEYS, 10)
    assert asm.feed(_msg(data=b"a" * 4, last=False)) is None
    with pytest.raises(TierCacheError, match="inside chunk 0"):
        asm.finish()


def test_a_reused_buffer_holds_each_chunk_until_the_next_one_starts() -> None:
    payloads = _payloads(False)
    msgs = [
        _as_load(m)
        for m in store_messages(b"h" * 16, KEYS, map(memoryview, payloads), CHUNK, 3000, Codec.RAW)
    ]
    asm = StreamAssembler(KEYS, CHUNK, reuse_buffer=True)
    seen: list[bytes] = []
    buffers: set[int] = set()
    for m in msgs:
        chunk = asm.feed(m)
        if chunk is not None:
            seen.append(bytes(chunk.data))  # consumed before the next piece arrives
            buffers.add(id(chunk.data))
    assert seen == payloads
    assert len(buffers) == 1  # one buffer for all chunks: no fresh multi-MiB allocation per chunk


def _framed(msg: pb.StreamLoadMessage) -> Framed[pb.StreamLoadMessage]:
    return split(msg.SerializeToString(), pb.StreamLoadMessage)  # as the connector's stub receives it


@pytest.mark.parametrize(
    ("msgs", "match"),
    [
        ([_msg(data=b"a" * 11)], "overruns"),
        ([_msg(data=b"a" * 9)], "ended at 9 bytes"),
        ([_msg(data=b"a" * 4, last=False), _msg(offset=5, data=b"a" * 6)], "offset 5, expected 4"),
        ([_msg(data=b"not zstd at all", codec=pb.CODEC_ZSTD)], "not a zstd frame"),
    ],
)
def test_framed_pieces_read_in_place_are_checked_the_same(
    msgs: list[pb.StreamLoadMessage], match: str
) -> None:
    asm = StreamAssembler(KEYS, 10)
    with pytest.raises(TierCacheError, match=match):
        for m in msgs:
            asm.feed(_framed(m))


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_store_frames_view_the_payload_and_round_trip_through_the_wire(codec: Codec) -> None:
    payloads = _payloads(True)
    frames = list(store_frames(b"h" * 16, KEYS, map(memoryview, payloads), CHUNK, 3000, codec, 2))
    if codec is Codec.RAW:
        assert all(memoryview(f.data).obj is p for f, p in zip(frames[::4], payloads))  # views, no copy
    # The first piece names the whole key chain (the daemon reserves it in one call), no other does.
    assert [list(f.header.keys) for f in frames] == [KEYS] + [[]] * (len(frames) - 1)
    wire = [f.serialize() for f in frames]
    assert [pb.StreamStoreMessage.FromString(w) for w in wire] == list(
        store_messages(b"h" * 16, KEYS, map(memoryview, payloads), CHUNK, 3000, codec, 2)
    )
    asm = StreamAssembler(KEYS, CHUNK, buffers=lambda: bytearray(CHUNK))
    got = [
        c for w in wire if (c := asm.feed(_framed(_as_load(pb.StreamStoreMessage.FromString(w))))) is not None
    ]
    assert [bytes(c.data) for c in got] == payloads


def test_buffers_of_the_wrong_size_are_refused() -> None:
    asm = StreamAssembler(KEYS, 10, buffers=lambda: bytearray(9))
    with pytest.raises(ValueError, match="9 bytes"):
        asm.feed(_msg())


def test_a_whole_raw_chunk_is_lent_as_a_read_only_view_of_its_message_and_the_rest_assembled() -> None:
    payloads = _payloads(True)
    packed = zstandard.ZstdCompressor().compress(payloads[2])
    msgs = [
        pb.StreamLoadMessage(index=0, key=KEYS[0], data=payloads[0], last=True, chunk_bytes=CHUNK),
        pb.StreamLoadMessage(index=1, key=KEYS[1], data=payloads[1][:4000], chunk_bytes=CHUNK),
        pb.StreamLoadMessage(
            index=1, key=KEYS[1], offset=4000, data=payloads[1][4000:], last=True, chunk_bytes=CHUNK
        ),
        pb.StreamLoadMessage(
            index=2, key=KEYS[2], data=packed, codec=pb.CODEC_ZSTD, last=True, chunk_bytes=CHUNK
        ),
    ]
    raw = [m.SerializeToString() for m in msgs]
    made: list[bytearray] = []

    def buffer() -> bytearray:
        made.append(bytearray(CHUNK))
        return made[-1]

    asm = StreamAssembler(KEYS, CHUNK, buffers=buffer, lend=True)
    got = [c for r in raw if (c := asm.feed(split(r, pb.StreamLoadMessage))) is not None]
    assert asm.finish() == 3
    assert [bytes(c.data) for c in got] == payloads
    lent = got[0].data
    assert isinstance(lent, memoryview) and lent.readonly and lent.obj is raw[0]  # no copy
    assert [c.data for c in got[1:]] == made  # several pieces, or zstd: assembled


def test_parts_are_cut_into_pieces_across_their_boundaries_without_a_copy() -> None:
    payloads = _payloads(False)
    cuts = (0, 1234, 1234, 5000, 9999, CHUNK)  # uneven parts, an empty one
    parts = [tuple(memoryview(p)[a:b] for a, b in pairwise(cuts)) for p in payloads]
    frames = list(store_frames(b"h", KEYS, parts, CHUNK, 3000))
    assert all(memoryview(x).obj is payloads[f.header.index] for f in frames for x in (f.data, *f.more))
    expected = list(store_messages(b"h", KEYS, map(memoryview, payloads), CHUNK, 3000))
    assert [pb.StreamStoreMessage.FromString(f.serialize()) for f in frames] == expected
    assert [f.message() for f in frames] == expected
    zstd = list(store_frames(b"h", KEYS, parts, CHUNK, 3000, Codec.ZSTD))
    assert [f.message() for f in zstd] == list(
        store_messages(b"h", KEYS, map(memoryview, payloads), CHUNK, 3000, Codec.ZSTD)
    )
    with pytest.raises(InvalidArgumentError, match=r"payloads\[0\]"):
        list(store_frames(b"h", KEYS, [parts[0][:-1]], CHUNK, 3000))

"""Framed messages: the same wire format as protobuf both ways, the data never copied on the way in."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.proto import tiercache_pb2 as pb
from tiercache.wire.framing import Framed, data_field_number, split

_pieces = st.builds(
    pb.StreamStoreMessage,
    handle=st.binary(max_size=40),
    start_depth=st.integers(0, 2**32 - 1),
    key=st.binary(max_size=40),
    index=st.integers(0, 2**32 - 1),
    offset=st.integers(0, 2**64 - 1),
    codec=st.sampled_from([pb.CODEC_RAW, pb.CODEC_ZSTD]),
    last=st.booleans(),
    chunk_bytes=st.integers(0, 2**64 - 1),
)


@settings(max_examples=200, deadline=None)
@given(header=_pieces, data=st.binary(max_size=3000))
def test_serialize_is_what_protobuf_parses_and_split_reads_what_protobuf_writes(
    header: pb.StreamStoreMessage, data: bytes
) -> None:
    whole = pb.StreamStoreMessage()
    whole.CopyFrom(header)
    whole.data = data
    assert pb.StreamStoreMessage.FromString(Framed(header, memoryview(data)).serialize()) == whole
    got = split(whole.SerializeToString(), pb.StreamStoreMessage)
    assert got.header == header
    assert bytes(got.data) == data
    assert got.message() == whole


def test_received_data_is_a_view_into_the_received_bytes() -> None:
    raw = pb.StreamLoadMessage(index=2, key=b"k" * 16, data=b"x" * 100_000, last=True).SerializeToString()
    got = split(raw, pb.StreamLoadMessage)
    view = memoryview(got.data)
    assert view.obj is raw  # no copy
    assert view.nbytes == 100_000 and got.header.index == 2 and not got.header.data


def test_the_last_data_field_wins_and_fields_may_come_in_any_order() -> None:
    number = data_field_number(pb.StreamLoadMessage)
    first = pb.StreamLoadMessage(data=b"old", index=1).SerializeToString()
    second = pb.StreamLoadMessage(data=b"new", last=True).SerializeToString()
    got = split(second + first + second, pb.StreamLoadMessage)  # a concatenation is a merge
    assert bytes(got.data) == b"new" and got.header.index == 1 and got.header.last
    assert number == 4


def test_an_unknown_field_and_a_group_are_left_to_protobuf() -> None:
    unknown = b"\x98\x06\x07"  # field 99, varint 7
    group = b"\xa3\x06\x08\x01\xa4\x06"  # field 100: a group holding field 1 = 1
    raw = pb.StreamLoadMessage(data=b"abc", index=5).SerializeToString()
    for extra in (unknown, group):
        got = split(raw + extra, pb.StreamLoadMessage)
        assert bytes(got.data) == b"abc" and got.header.index == 5


@pytest.mark.parametrize(
    "raw",
    [
        b"\x22\x05abc",  # data field shorter than its length
        b"\x08",  # varint cut off
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # varint longer than 10 bytes
        b"\x11\x01\x02",  # fixed64 cut off
        b"\x00\x01",  # field number 0
    ],
)
def test_malformed_bytes_raise_decode_error(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        split(raw, pb.StreamLoadMessage)


def test_a_type_without_a_bytes_data_field_is_refused() -> None:
    with pytest.raises(ValueError, match="no bytes field named data"):
        data_field_number(pb.LookupRequest)

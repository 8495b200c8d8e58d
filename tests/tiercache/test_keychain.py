"""Packed key chains behave exactly as the list of keys they pack: items, slices, iteration, storage ids;
malformed input is refused naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.errors import InvalidArgumentError
from tiercache.keychain import PackedKeys
from tiercache.keys import KEY_BYTES

KEY = st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(KEY, max_size=80), st.binary(min_size=0, max_size=24), st.integers(-90, 90), st.integers(-90, 90)
)
def test_a_packed_chain_is_its_list_of_keys(keys: list[bytes], prefix: bytes, a: int, b: int) -> None:
    packed = PackedKeys.pack(keys)
    assert packed.data == b"".join(keys)
    assert len(packed) == len(keys) and list(packed) == keys and packed.keys() == keys
    assert [packed[i] for i in range(-len(keys), len(keys))] == keys[-len(keys) :] + keys
    assert packed[a:b].keys() == keys[a:b]
    assert packed[a:b:2].keys() == keys[a:b:2]
    # Both ways of making the ids (Python slices below 32 keys, numpy from 32) give prefix + key.
    assert packed.prefixed(prefix) == [prefix + k for k in keys]
    assert PackedKeys(packed.data) == packed


def test_keys_ending_in_zero_bytes_keep_them() -> None:
    keys = [bytes(KEY_BYTES), b"\x01" + bytes(KEY_BYTES - 1)] * 20  # 40 keys: the numpy path
    packed = PackedKeys.pack(keys)
    assert packed.keys() == keys
    assert packed.prefixed(b"\x00" * 16) == [b"\x00" * 16 + k for k in keys]


def test_an_index_out_of_range_raises_index_error() -> None:
    packed = PackedKeys.pack([bytes(KEY_BYTES)] * 2)
    with pytest.raises(IndexError):
        packed[2]
    with pytest.raises(IndexError):
        packed[-3]


@pytest.mark.parametrize("size", [1, KEY_BYTES - 1, KEY_BYTES + 1, 3 * KEY_BYTES - 5])
def test_data_of_no_whole_number_of_keys_is_refused(size: int) -> None:
    with pytest.raises(InvalidArgumentError, match=f"packed_keys: {size} bytes is not a whole number"):
        PackedKeys(b"k" * size)


def test_malformed_keys_are_refused_naming_the_key() -> None:
    good = bytes(KEY_BYTES)
    with pytest.raises(InvalidArgumentError, match=r"keys\[1\]: must be 32 bytes, got 5"):
        PackedKeys.pack([good, b"short", good])
    with pytest.raises(InvalidArgumentError, match=r"keys\[0\]: must be 32 bytes, got int"):
        PackedKeys.pack([7])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match=r"keys\[0\]: must be 32 bytes, got 31"):
        PackedKeys.pack([good[:31], good + b"x"])  # 64 bytes in all: each key is still checked
    with pytest.raises(InvalidArgumentError, match="keys: must be a sequence of keys, not a single value"):
        PackedKeys.pack(good * 2)
    with pytest.raises(InvalidArgumentError, match="packed_keys: must be bytes, got bytearray"):
        PackedKeys(bytearray(KEY_BYTES))  # type: ignore[arg-type]

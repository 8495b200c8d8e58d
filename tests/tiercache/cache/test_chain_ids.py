"""Chunk ids of a chain (:meth:`Namespaces.chunk_ids`, the first step of every lookup, lease and store):
bytes-like keys in bulk, anything else checked one by one with an error naming the key."""

from __future__ import annotations

import threading

import pytest

from tiercache.cache.namespaces import Namespaces
from tiercache.errors import InvalidArgumentError, NotFoundError
from tiercache.keychain import PackedKeys
from tiercache.keys import KEY_BYTES, Namespace, chunk_id, chunk_keys
from tiercache.layout import KVDtype, KVLayout

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype=KVDtype.BFLOAT16, chunk_tokens=16)
NS = Namespace("test/ids", "r1", LAYOUT)


@pytest.fixture
def registered() -> tuple[Namespaces, bytes]:
    namespaces = Namespaces(threading.RLock(), {})
    return namespaces, namespaces.register(NS, "", lambda: None)


def test_bytes_like_keys_give_the_ids_of_their_bytes(registered: tuple[Namespaces, bytes]) -> None:
    namespaces, handle = registered
    keys = chunk_keys(NS, list(range(4 * LAYOUT.chunk_tokens)))
    expected = [chunk_id(handle, k) for k in keys]
    assert namespaces.chunk_ids(handle, keys) == expected
    mixed = [keys[0], bytearray(keys[1]), memoryview(keys[2]), keys[3]]
    ids = namespaces.chunk_ids(handle, mixed)
    assert ids == expected and all(type(c) is bytes for c in ids)


@pytest.mark.parametrize(
    ("bad", "message"),
    [(b"\x01" * (KEY_BYTES - 1), f"got {KEY_BYTES - 1}"), (b"\x01" * (KEY_BYTES + 1), f"got {KEY_BYTES + 1}"),
     ("x" * KEY_BYTES, "got str"), (7, "got int")],
)  # fmt: skip
def test_a_bad_key_is_named(registered: tuple[Namespaces, bytes], bad: object, message: str) -> None:
    namespaces, handle = registered
    keys: list[object] = [b"\x00" * KEY_BYTES, b"\x02" * KEY_BYTES, bad]
    with pytest.raises(InvalidArgumentError, match=rf"keys\[2\]: must be {KEY_BYTES} bytes, {message}"):
        namespaces.chunk_ids(handle, keys)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, 3, 40])  # 40: the numpy path
def test_packed_keys_give_the_ids_of_their_keys(registered: tuple[Namespaces, bytes], n: int) -> None:
    namespaces, handle = registered
    keys = chunk_keys(NS, list(range(n * LAYOUT.chunk_tokens)))
    assert namespaces.chunk_ids(handle, PackedKeys.pack(keys)) == [chunk_id(handle, k) for k in keys]
    with pytest.raises(NotFoundError):
        namespaces.chunk_ids(b"\x07" * len(handle), PackedKeys.pack(keys))

"""A chain of chunk keys held as one bytes object: what a Lookup carries on the wire as ``packed_keys``.

Why: a lookup of a long prompt names hundreds of keys, and each key as a separate object costs at every
step: protobuf encodes, decodes and hands back one object per key of a repeated field, and the cache then
prefixes each with the namespace id in Python. Concatenated, the chain is one field to encode and decode, and
its storage ids are made in one numpy pass (:meth:`PackedKeys.prefixed`). Measured on the 2-core dev host, a
512-key chain: a repeated field costs ~20 us to build and ~38 us to decode into a list against ~5 us to join
into one field, and the ids ~60 us through ``map(prefix.__add__, keys)`` against ~29 us here.

A :class:`PackedKeys` is a ``Sequence[bytes]``: wherever the cache takes a key chain it can take one, and
its items and slices are exactly those of the list of keys it packs.

Primitives:
    PackedKeys: ``pack(keys)``, ``data``, ``len``, items and slices, ``prefixed(prefix)``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TypeVar, cast, overload

import numpy as np

from tiercache.errors import InvalidArgumentError
from tiercache.keys import KEY_BYTES

P = TypeVar("P", bound="PackedKeys")
_KEY = np.dtype(f"V{KEY_BYTES}")
_NUMPY_FROM = 32
"""Chains this long or longer get their ids from numpy (~5 us a call, ~0.05 us a key on the dev host); a
shorter one by Python slices (~0.2 us a key)."""


class PackedKeys(Sequence[bytes]):
    """Chunk keys concatenated, ``KEY_BYTES`` each, in chain order. Immutable."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes, field: str = "packed_keys") -> None:
        """Args: data: the keys, concatenated; field: the name an error gives it.

        Raises:
            InvalidArgumentError: ``data`` is not bytes, or not a whole number of keys long.
        """
        if not isinstance(data, bytes):
            raise InvalidArgumentError(field, f"must be bytes, got {type(data).__name__}")
        if len(data) % KEY_BYTES:
            raise InvalidArgumentError(
                field, f"{len(data)} bytes is not a whole number of {KEY_BYTES}-byte keys"
            )
        self._data = data

    @classmethod
    def pack(cls: type[P], keys: Sequence[bytes], field: str = "keys") -> P:
        """The keys of a list, packed.

        Raises:
            InvalidArgumentError: a key is not ``KEY_BYTES`` bytes (``keys[i]``), or ``keys`` is one bytes
                value rather than a sequence of keys.
        """
        if isinstance(keys, PackedKeys):
            return cls(keys.data, field)
        if isinstance(keys, (bytes, bytearray, memoryview, str)):
            raise InvalidArgumentError(field, "must be a sequence of keys, not a single value")
        try:  # the usual case, in C-speed passes: bytes-like keys of the right length (counted: ~25% faster
            # than a set of the lengths for a 512-key chain)
            if list(map(len, keys)).count(KEY_BYTES) == len(keys):
                data = b"".join(keys)
                if len(data) == len(keys) * KEY_BYTES:  # (a memoryview's len counts items, not bytes)
                    return cls(data, field)
        except TypeError:
            pass  # an item without a length, or not bytes-like: named below
        for i, key in enumerate(keys):
            like = isinstance(key, (bytes, bytearray, memoryview))
            if not like or len(bytes(key)) != KEY_BYTES:
                got = len(bytes(key)) if like else type(key).__name__
                raise InvalidArgumentError(f"{field}[{i}]", f"must be {KEY_BYTES} bytes, got {got}")
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def data(self) -> bytes:
        """The keys, concatenated."""
        return self._data

    def __len__(self) -> int:
        return len(self._data) // KEY_BYTES

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> PackedKeys: ...

    def __getitem__(self, index: int | slice) -> bytes | PackedKeys:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return PackedKeys(self._data[start * KEY_BYTES : max(start, stop) * KEY_BYTES])
            return PackedKeys(b"".join(self.keys()[index]))
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"key index {index} out of range for {n} keys")
        return self._data[i * KEY_BYTES : (i + 1) * KEY_BYTES]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackedKeys) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __repr__(self) -> str:
        return f"PackedKeys({len(self)} keys)"

    def keys(self) -> list[bytes]:
        """The keys, one bytes object each (one numpy pass)."""
        return list(np.frombuffer(self._data, _KEY).tolist())

    def prefixed(self, prefix: bytes) -> list[bytes]:
        """``prefix + key`` for every key, in order (the storage ids of a namespace's chain): for a long chain
        in one numpy pass rather than a Python concatenation per key."""
        n, width, data = len(self), len(prefix), self._data
        if n < _NUMPY_FROM or not width:
            return [prefix + data[i : i + KEY_BYTES] for i in range(0, len(data), KEY_BYTES)]
        # one record (prefix, key) per id, filled a column at a time: ~3 us fewer numpy calls than through
        # a 2-D byte array (~11 against ~14 us for 512 ids on the dev host)
        ids = np.empty(n, _record(width))
        ids["prefix"] = np.frombuffer(prefix, f"V{width}")[0]
        ids["key"] = np.frombuffer(data, _KEY)
        return cast("list[bytes]", ids.view(f"V{width + KEY_BYTES}").tolist())


@functools.lru_cache(maxsize=8)
def _record(width: int) -> np.dtype[np.void]:
    """The record of a storage id: a ``width``-byte prefix, then a key."""
    return np.dtype([("prefix", f"V{width}"), ("key", _KEY)])

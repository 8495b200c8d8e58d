"""Namespaces and chunk keys: hash chains over token ids.

``root = H(namespace)``; ``key_0 = H(root || tokens[0:C])``; ``key_i = H(key_{i-1} || tokens[iC:(i+1)C])``.
H is BLAKE2b. Token ids are encoded as unsigned 32-bit little-endian integers, so keys agree across
processes, hosts and ``PYTHONHASHSEED`` values. Only full chunks are keyed.

Primitives:
    Namespace: every factor that changes KV bytes; ``digest`` is the chain root and ``namespace_id`` the
        16-byte id the cache scopes its chunks by.
    chunk_keys: the chain of chunk keys of a token sequence.
    chunk_id / split_chunk_id: the storage id (namespace id + key) a tier files a chunk under.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVLayout

KEY_BYTES = 32
"""Length of a chunk key (BLAKE2b-256)."""
NAMESPACE_ID_BYTES = 16
"""Length of a namespace id (BLAKE2b-128 of the namespace encoding)."""
CHUNK_ID_BYTES = NAMESPACE_ID_BYTES + KEY_BYTES
"""Length of a storage id: namespace id followed by chunk key."""
_FORMAT = b"tiercache.ns.v1"
_MAX_TOKEN = 2**32 - 1


def _field(value: str | int | bool | bytes) -> bytes:
    """Length-prefixed, type-tagged encoding of one field (unambiguous concatenation)."""
    if isinstance(value, bool):
        raw, tag = (b"\x01" if value else b"\x00"), b"b"
    elif isinstance(value, int):
        raw, tag = struct.pack("<q", value), b"i"
    elif isinstance(value, str):
        raw, tag = value.encode("utf-8"), b"s"
    else:
        raw, tag = bytes(value), b"y"
    return tag + struct.pack("<I", len(raw)) + raw


@dataclass(frozen=True, slots=True)
class Namespace:
    """Everything that changes the bytes of a KV cache; two namespaces never share a chunk key.

    Attributes:
        model_id: model name, e.g. ``meta-llama/Llama-3.1-8B``.
        revision: weight revision (commit hash or version tag).
        layout: KV layout (layers, heads, head dim, dtype, chunk and page size, MLA).
        tokenizer_id: tokenizer and chat-template identity.
        tp_rank: tensor-parallel rank; ``tp_size`` its world size.
        pp_rank: pipeline-parallel rank; ``pp_size`` its world size.
        adapter_id: LoRA/adapter id, empty for the base model.
        cache_salt: the tenant's cache salt (empty for none).
    """

    model_id: str
    revision: str
    layout: KVLayout
    tokenizer_id: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    adapter_id: str = ""
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise InvalidArgumentError("model_id", f"must be a non-empty string, got {self.model_id!r}")
        for name in ("revision", "tokenizer_id", "adapter_id", "cache_salt"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(name, f"must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.layout, KVLayout):
            raise InvalidArgumentError("layout", f"must be a KVLayout, got {type(self.layout).__name__}")
        for rank, size in (("tp_rank", "tp_size"), ("pp_rank", "pp_size")):
            r, s = getattr(self, rank), getattr(self, size)
            if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
                raise InvalidArgumentError(size, f"must be a positive integer, got {s!r}")
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < s:
                raise InvalidArgumentError(rank, f"{r!r} not in [0, {s})")

    def encode(self) -> bytes:
        """Canonical byte encoding of every field (stable across versions of Python and processes)."""
        lay = self.layout
        fields: tuple[str | int | bool | bytes, ...] = (
            _FORMAT,
            self.model_id,
            self.revision,
            self.tokenizer_id,
            lay.dtype.value,
            lay.num_layers,
            lay.num_kv_heads,
            lay.head_dim,
            lay.chunk_tokens,
            lay.page_tokens,
            lay.mla,
            self.tp_rank,
            self.tp_size,
            self.pp_rank,
            self.pp_size,
            self.adapter_id,
            self.cache_salt,
        )
        return b"".join(_field(f) for f in fields)

    @property
    def digest(self) -> bytes:
        """The chain root: BLAKE2b-256 of the canonical encoding."""
        return hashlib.blake2b(self.encode(), digest_size=KEY_BYTES, person=b"tc-root").digest()

    @property
    def namespace_id(self) -> bytes:
        """The 16-byte id under which the cache files this namespace's chunks for the default tenant."""
        return self.scoped_id("")

    def scoped_id(self, tenant: str) -> bytes:
        """The 16-byte id under which the cache files this namespace's chunks for ``tenant``.

        Different tenants get different ids for the same namespace, so knowing another tenant's keys does
        not reach its chunks.
        """
        h = hashlib.blake2b(self.encode(), digest_size=NAMESPACE_ID_BYTES, person=b"tc-nsid")
        if tenant:
            h.update(_field(tenant))
        return h.digest()


def encode_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Validate token ids and return them as a little-endian ``uint32`` array.

    Raises:
        InvalidArgumentError: a token id is negative, too large or not an integer.
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise InvalidArgumentError("tokens", f"must be a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype="<u4")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError("tokens", f"must be integers, got dtype {arr.dtype}")
    low, high = int(arr.min()), int(arr.max())
    if low < 0 or high > _MAX_TOKEN:
        bad = low if low < 0 else high
        raise InvalidArgumentError("tokens", f"token id {bad} outside [0, {_MAX_TOKEN}]")
    return arr.astype("<u4", copy=False)


def chunk_keys(namespace: Namespace, tokens: Sequence[int] | np.ndarray) -> list[bytes]:
    """Keys of the full chunks of ``tokens`` in ``namespace`` (a trailing partial chunk has no key).

    Args:
        namespace: the namespace; its layout gives the chunk size.
        tokens: token ids, each in ``[0, 2**32)``.

    Returns:
        One ``KEY_BYTES``-long key per full chunk, in prompt order.

    Raises:
        InvalidArgumentError: a token id is out of range.
    """
    encoded = encode_tokens(tokens)
    size = namespace.layout.chunk_tokens
    prev = namespace.digest
    keys: list[bytes] = []
    for start in range(0, encoded.size - size + 1, size):
        h = hashlib.blake2b(prev, digest_size=KEY_BYTES, person=b"tc-chunk")
        h.update(encoded[start : start + size].tobytes())
        prev = h.digest()
        keys.append(prev)
    return keys


def check_key(key: bytes, field: str = "key") -> bytes:
    """Return ``key`` as bytes if it is a well-formed chunk key.

    Raises:
        InvalidArgumentError: it is not ``KEY_BYTES`` bytes long.
    """
    if not isinstance(key, (bytes, bytearray, memoryview)) or len(key) != KEY_BYTES:
        length = len(key) if isinstance(key, (bytes, bytearray, memoryview)) else type(key).__name__
        raise InvalidArgumentError(field, f"must be {KEY_BYTES} bytes, got {length}")
    return bytes(key)


def chunk_id(namespace_id: bytes, key: bytes) -> bytes:
    """Storage id of a chunk: namespace id followed by the chunk key."""
    return namespace_id + key


def split_chunk_id(cid: bytes) -> tuple[bytes, bytes]:
    """Inverse of :func:`chunk_id`: ``(namespace_id, key)``.

    Raises:
        InvalidArgumentError: ``cid`` is not ``CHUNK_ID_BYTES`` long.
    """
    if len(cid) != CHUNK_ID_BYTES:
        raise InvalidArgumentError("chunk_id", f"must be {CHUNK_ID_BYTES} bytes, got {len(cid)}")
    return cid[:NAMESPACE_ID_BYTES], cid[NAMESPACE_ID_BYTES:]

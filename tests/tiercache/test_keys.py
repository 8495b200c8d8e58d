"""Chunk keys: hash-chain properties, determinism across interpreters, namespace separation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiercache.errors import InvalidArgumentError
from tiercache.keys import (
    CHUNK_ID_BYTES,
    KEY_BYTES,
    Namespace,
    check_key,
    chunk_id,
    chunk_keys,
    split_chunk_id,
)
from tiercache.layout import KVDtype, KVLayout

LAYOUT = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=8, dtype=KVDtype.BFLOAT16, chunk_tokens=4, page_tokens=2
)
NS = Namespace(model_id="m", revision="r", layout=LAYOUT)
tokens_st = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=40)


@given(tokens_st)
def test_full_chunks_only_and_key_length(tokens: list[int]) -> None:
    keys = chunk_keys(NS, tokens)
    assert len(keys) == len(tokens) // LAYOUT.chunk_tokens
    assert all(len(k) == KEY_BYTES for k in keys)
    assert len(set(keys)) == len(keys)


@given(tokens_st, tokens_st, tokens_st)
def test_prefix_property(shared: list[int], tail_a: list[int], tail_b: list[int]) -> None:
    a, b = shared + tail_a, shared + tail_b
    ka, kb = chunk_keys(NS, a), chunk_keys(NS, b)
    c = LAYOUT.chunk_tokens
    first_diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    same_chunks = first_diff // c
    for i in range(min(len(ka), len(kb))):
        if i < same_chunks:
            assert ka[i] == kb[i]
        else:
            assert ka[i] != kb[i], "a chunk at or after the first difference must never share a key"


@given(tokens_st)
def test_deterministic(tokens: list[int]) -> None:
    assert chunk_keys(NS, tokens) == chunk_keys(NS, list(tokens))


_NS_VARIANTS = {
    "model_id": "m2",
    "revision": "r2",
    "tokenizer_id": "t2",
    "tp_rank": 1,
    "tp_size": 2,
    "pp_rank": 1,
    "pp_size": 2,
    "adapter_id": "lora-a",
    "cache_salt": "tenant-b",
    "layout": dataclasses.replace(LAYOUT, dtype=KVDtype.FLOAT16),
}
_LAYOUT_VARIANTS = {
    "num_layers": 3,
    "num_kv_heads": 4,
    "head_dim": 16,
    "page_tokens": 4,
}


@pytest.mark.parametrize("field,value", sorted(_NS_VARIANTS.items()))
@settings(max_examples=20)
@given(tokens=st.lists(st.integers(0, 50_000), min_size=4, max_size=16))
def test_namespace_separation(field: str, value: object, tokens: list[int]) -> None:
    base = NS if field not in ("tp_rank", "pp_rank") else dataclasses.replace(NS, tp_size=2, pp_size=2)
    other = dataclasses.replace(base, **{field: value})
    assert other.digest != base.digest and other.namespace_id != base.namespace_id
    assert set(chunk_keys(other, tokens)).isdisjoint(chunk_keys(base, tokens))


@pytest.mark.parametrize("field,value", sorted(_LAYOUT_VARIANTS.items()))
def test_layout_fields_change_the_root(field: str, value: int) -> None:
    other = dataclasses.replace(NS, layout=dataclasses.replace(LAYOUT, **{field: value}))
    assert other.digest != NS.digest


def test_mla_and_chunk_size_change_the_root() -> None:
    mla = dataclasses.replace(LAYOUT, num_kv_heads=1, mla=True)
    one_head = dataclasses.replace(LAYOUT, num_kv_heads=1)
    assert dataclasses.replace(NS, layout=mla).digest != dataclasses.replace(NS, layout=one_head).digest
    bigger = dataclasses.replace(LAYOUT, chunk_tokens=8)
    assert dataclasses.replace(NS, layout=bigger).digest != NS.digest


def test_field_boundaries_are_unambiguous() -> None:
    # Concatenation without length prefixes would make these two equal.
    a = dataclasses.replace(NS, model_id="ab", revision="c")
    b = dataclasses.replace(NS, model_id="a", revision="bc")
    assert a.digest != b.digest


_SCRIPT = textwrap.dedent(
    """
    from tiercache.keys import Namespace, chunk_keys
    from tiercache.layout import KVDtype, KVLayout
    lay = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, dtype=KVDtype.BFLOAT16, chunk_tokens=4, page_tokens=2)
    ns = Namespace(model_id="m", revision="r", layout=lay)
    print(",".join(k.hex() for k in chunk_keys(ns, list(range(1000, 1013)))))
    """
)


def test_same_keys_in_two_interpreters_with_different_hash_seeds() -> None:
    outs = []
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        outs.append(res.stdout.strip())
    assert outs[0] == outs[1]
    assert outs[0] == ",".join(k.hex() for k in chunk_keys(NS, list(range(1000, 1013))))
    assert len(outs[0].split(",")) == 3


def test_known_answer_pins_the_encoding() -> None:
    # A change of hash, token width or byte order would change every key in every fleet: pin it.
    expected = chunk_keys(NS, [0, 1, 2, 3])[0]
    import hashlib

    h = hashlib.blake2b(NS.digest, digest_size=32, person=b"tc-chunk")
    h.update(b"\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00")
    assert expected == h.digest()


@pytest.mark.parametrize("bad", [[-1], [2**32], [1.5], [[1, 2]]])
def test_bad_tokens(bad: list[object]) -> None:
    with pytest.raises(InvalidArgumentError, match="tokens"):
        chunk_keys(NS, bad)  # type: ignore[arg-type]


def test_bad_namespace_fields() -> None:
    with pytest.raises(InvalidArgumentError, match="model_id"):
        Namespace(model_id="", revision="r", layout=LAYOUT)
    with pytest.raises(InvalidArgumentError, match="tp_rank"):
        Namespace(model_id="m", revision="r", layout=LAYOUT, tp_rank=2, tp_size=2)
    with pytest.raises(InvalidArgumentError, match="pp_size"):
        Namespace(model_id="m", revision="r", layout=LAYOUT, pp_size=0)
    with pytest.raises(InvalidArgumentError, match="layout"):
        Namespace(model_id="m", revision="r", layout="llama")  # type: ignore[arg-type]


def test_key_and_chunk_id_validation() -> None:
    key = chunk_keys(NS, [1, 2, 3, 4])[0]
    assert check_key(key) == key
    with pytest.raises(InvalidArgumentError, match=r"keys\[3\]: must be 32 bytes, got 5"):
        check_key(b"short", "keys[3]")
    cid = chunk_id(NS.namespace_id, key)
    assert len(cid) == CHUNK_ID_BYTES and split_chunk_id(cid) == (NS.namespace_id, key)
    with pytest.raises(InvalidArgumentError, match="chunk_id"):
        split_chunk_id(cid[:-1])

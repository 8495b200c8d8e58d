"""Engine-side KV tensors of a benchmark and their verification.

Primitives:
    make_contiguous_kv: seeded random bf16-like per-layer KV tensors ``[2, tokens, heads, dim]``.
    zeros_like_kv: zeroed tensors of the same shapes (load destinations).
    verify_kv: the first ``tokens`` tokens of two engine KVs are equal byte for byte, else
        :class:`~tiercache.bench.common.tier_ops.RoundTripError` naming the layer and the first differing token.
    distinct_prompts: token-id arrays of equal length whose chunk chains share nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from tiercache.connector import ContiguousKV
from tiercache.layout import KVLayout

from .tier_ops import RoundTripError

VOCAB = 32000
"""Token ids are drawn from ``[0, VOCAB)``."""


def make_contiguous_kv(layout: KVLayout, tokens: int, seed: int) -> ContiguousKV:
    """Random normal values in the layout's dtype, one ``[2, tokens, heads, dim]`` tensor per layer."""
    gen = torch.Generator().manual_seed(seed)
    shape = (tokens, layout.head_dim) if layout.mla else (2, tokens, layout.num_kv_heads, layout.head_dim)
    dtype = layout.dtype.torch_dtype
    return ContiguousKV([torch.randn(shape, generator=gen).to(dtype) for _ in range(layout.num_layers)])


def zeros_like_kv(kv: ContiguousKV) -> ContiguousKV:
    """Zeroed tensors of the same shapes, dtypes and devices."""
    return ContiguousKV([torch.zeros_like(t) for t in kv.layers])


def zero_kv(kv: ContiguousKV) -> None:
    """Zero every tensor of ``kv`` in place."""
    for t in kv.layers:
        t.zero_()


def verify_kv(expected: ContiguousKV, got: ContiguousKV, tokens: int, mla: bool = False) -> int:
    """Compare the first ``tokens`` tokens of every layer, byte for byte.

    Returns:
        Bytes verified.

    Raises:
        RoundTripError: a layer differs (the message names the layer and the first differing token).
    """
    verified = 0
    for i, (a, b) in enumerate(zip(expected.layers, got.layers, strict=True)):
        sa = a[:tokens] if mla else a[:, :tokens]
        sb = b[:tokens] if mla else b[:, :tokens]
        ba = sa.contiguous().view(torch.uint8)
        bb = sb.contiguous().view(torch.uint8)
        if not torch.equal(ba, bb):
            diff = torch.nonzero(ba != bb)[0]
            token = int(diff[0] if mla else diff[1])
            raise RoundTripError(f"layer {i}: loaded KV differs from the stored KV, first at token {token}")
        verified += ba.numel()
    return verified


def distinct_prompts(count: int, tokens: int, seed: int) -> list[np.ndarray]:
    """``count`` random prompts of ``tokens`` token ids each (``uint32``), distinct from their first token."""
    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(count):
        p = rng.integers(0, VOCAB, size=tokens, dtype=np.int64).astype(np.uint32)
        if tokens:
            p[0] = VOCAB + i  # distinct first chunks: no two prompts share a chain
        prompts.append(p)
    return prompts

"""A tiny engine process for the end-to-end tests (run as a script; also imported by the tests by path).

It stores or loads the KV of a deterministic prompt through the connector and says one message (the line
protocol of :mod:`tiercache.testing.engine`: params on stdin). The source KV is regenerated from a seed, so
any process can check a load bit-exactly.

Usage: ``python engine_proc.py`` with ``mode`` in ``store``, ``load``, ``hold``, ``claim`` (claim the
prompt's prefill as leader with ``ttl_s``, say the claim, then hang until killed).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch

from tiercache.connector import (
    ClientConfig,
    Codec,
    ConnectorConfig,
    ContiguousKV,
    DataPlaneMode,
    EngineKV,
    KVConnector,
    PagedKV,
    TierCacheClient,
)
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.engine import read_params, say

LAYOUT = KVLayout(2, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=4)
"""2 layers x 2 kv heads x 16 dims x 16 tokens, bf16: 4 KiB per chunk."""


def namespace(salt: str = "") -> Namespace:
    """The test model's namespace."""
    return Namespace(
        model_id="test/e2e-tiny", revision="r1", layout=LAYOUT, tokenizer_id="tok", cache_salt=salt
    )


def prompt(seed: int, n_tokens: int) -> list[int]:
    """Deterministic token ids."""
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(0, 50_000, (n_tokens,), generator=gen)]


def token_major(seed: int, n_tokens: int) -> list[torch.Tensor]:
    """The source KV in token order: per layer ``[2, tokens, heads, dim]`` (deterministic from ``seed``)."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    shape = (2, n_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(LAYOUT.num_layers)]


def block_ids(seed: int, n_blocks: int, pool: int) -> list[int]:
    """A request's (scattered) block ids in a pool of ``pool`` blocks."""
    gen = torch.Generator().manual_seed(seed + 77)
    return [int(b) for b in torch.randperm(pool, generator=gen)[:n_blocks]]


def paged_from(layers: list[torch.Tensor], ids: list[int], pool: int) -> PagedKV:
    """A paged KV holding ``layers`` (token order) in blocks ``ids``; other blocks hold noise."""
    b = LAYOUT.page_tokens
    out = []
    for layer in layers:
        buf = torch.full((2, pool, b, LAYOUT.num_kv_heads, LAYOUT.head_dim), -7.0, dtype=layer.dtype)
        for i, block in enumerate(ids):
            buf[:, block] = layer[:, i * b : (i + 1) * b]
        out.append(buf)
    return PagedKV(out, ids)


def to_token_major(kv: EngineKV, n_tokens: int) -> list[torch.Tensor]:
    """Read an engine KV back in token order (per layer ``[2, tokens, heads, dim]``)."""
    if isinstance(kv, ContiguousKV):
        return [t[:, :n_tokens] for t in kv.layers]
    b = LAYOUT.page_tokens
    return [torch.cat([t[:, kv.block_ids[i]] for i in range(n_tokens // b)], dim=1) for t in kv.layers]


def source_kv(seed: int, n_tokens: int, paged: bool) -> EngineKV:
    """The storing engine's KV of the prompt."""
    layers = token_major(seed, n_tokens)
    if not paged:
        return ContiguousKV(layers)
    n_blocks = n_tokens // LAYOUT.page_tokens
    return paged_from(layers, block_ids(seed, n_blocks, 2 * n_blocks), 2 * n_blocks)


def empty_kv(seed: int, n_tokens: int, paged: bool) -> EngineKV:
    """A loading engine's KV for the prompt: zeros (paged: other block ids than the storer's)."""
    shape = (2, n_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    layers = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(LAYOUT.num_layers)]
    if not paged:
        return ContiguousKV(layers)
    n_blocks = n_tokens // LAYOUT.page_tokens
    return paged_from(layers, block_ids(seed + 5, n_blocks, 3 * n_blocks), 3 * n_blocks)


def digest(layers: list[torch.Tensor], n_tokens: int) -> str:
    """SHA-256 of the first ``n_tokens`` tokens of token-major layers."""
    h = hashlib.sha256()
    for t in layers:
        h.update(t[:, :n_tokens].contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def exact(loaded: EngineKV, seed: int, n_tokens: int, upto: int) -> bool:
    """Whether the first ``upto`` tokens of ``loaded`` equal the source bit for bit."""
    want = token_major(seed, n_tokens)
    got = to_token_major(loaded, n_tokens)
    return all(
        torch.equal(w[:, :upto].view(torch.int16), g[:, :upto].view(torch.int16)) for w, g in zip(want, got)
    )


def connector(p: dict[str, Any]) -> KVConnector:
    """A connector built from the JSON params."""
    client = TierCacheClient.connect(p["address"], token=p.get("token"), config=ClientConfig(timeout_s=10.0))
    cfg = ConnectorConfig(DataPlaneMode(p.get("data_plane", "auto")), Codec[p.get("codec", "RAW")])
    return KVConnector(client, namespace(p.get("salt", "")), cfg)


def main(p: dict[str, Any]) -> dict[str, Any]:
    """Run one mode; returns the JSON-able outcome."""
    seed, n, paged = p["seed"], p["tokens"], p.get("paged", False)
    conn = connector(p)
    tokens = prompt(seed, n)
    if p["mode"] == "store":
        res = conn.store(tokens, source_kv(seed, n, paged))
        return {"stored": res.tokens_stored, "skipped": res.tokens_skipped, "remote": res.remote}
    if p["mode"] == "load":
        kv = empty_kv(seed, n, paged)
        res = conn.load(tokens, kv)
        return {
            "loaded": res.tokens_loaded,
            "hit": res.tokens_hit,
            "remote": res.remote,
            "exact": exact(kv, seed, n, res.tokens_loaded),
            "digest": digest(to_token_major(kv, n), res.tokens_loaded),
        }
    if p["mode"] == "hold":
        keys = chunk_keys(conn.namespace, tokens)
        lease = conn.client.acquire_load(conn.namespace, keys)
        active = conn.client.stats().active_leases
        say({"lease_id": lease.lease_id, "chunks": len(lease.slots), "active_leases": active})
        time.sleep(600)  # hold the lease until the test kills this process
    if p["mode"] == "claim":
        claim = conn.prefill_claim(tokens, ttl_s=p["ttl_s"])
        say({"lead": claim.lead_tokens, "leader": claim.leader})
        time.sleep(600)  # lead without ever publishing, until the test kills this process
    raise SystemExit(f"unknown mode {p['mode']!r}")


if __name__ == "__main__":
    say(main(read_params()))

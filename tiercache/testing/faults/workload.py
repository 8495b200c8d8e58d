"""The deterministic prompts and KV of the fault runs, and a bit-exact check of every load.

A prompt is named by an integer: its token ids and its KV are regenerated from that number, so any process
(an engine that stores, another that loads, the run after a daemon restart) can tell whether the bytes a
load put into its tensors are the stored ones. Prompts of one "family" share their first chunks, so the
daemon sees chains that branch (mixed prompts).

Primitives:
    LAYOUT: the small KV layout of the fault runs (4 KiB chunks).
    namespace: the runs' namespace.
    prompt_tokens / prompt_kv / empty_kv: a prompt's token ids, its source KV, zeroed tensors to load into.
    LoadCheck: tokens loaded and whether they were bit-exact.
    store_prompt / load_and_check: one store, one verified load through a connector.
    connect: a connector to a daemon address.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiercache.connector import ClientConfig, ConnectorConfig, ContiguousKV, KVConnector, TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout

LAYOUT = KVLayout(2, 2, 32, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16)
"""2 layers x K|V x 16 tokens x 2 heads x 32 dims x bf16: 8 KiB per chunk."""
_FAMILY_CHUNKS = 2
"""Leading chunks a prompt shares with the other prompts of its family."""
_FAMILIES = 16


def namespace(salt: str = "faults") -> Namespace:
    """The namespace of the fault runs (``salt`` separates runs on one daemon)."""
    return Namespace(
        model_id="bench/faults", revision="r1", layout=LAYOUT, tokenizer_id="tok", cache_salt=salt
    )


def _chunk_tokens(seed: int, index: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return [int(t) for t in torch.randint(0, 50_000, (LAYOUT.chunk_tokens,), generator=gen)]


def _chunk_seed(prompt: int, index: int) -> int:
    """Whose chunk sits at ``index`` of ``prompt``: the family's for the shared prefix, else the prompt's."""
    return (prompt % _FAMILIES) + 1 if index < _FAMILY_CHUNKS else prompt + 1_000


def prompt_tokens(prompt: int, chunks: int) -> list[int]:
    """The token ids of prompt ``prompt``: ``chunks`` full chunks."""
    return [t for i in range(chunks) for t in _chunk_tokens(_chunk_seed(prompt, i), i)]


def prompt_kv(prompt: int, chunks: int) -> ContiguousKV:
    """The source KV of a prompt: per layer ``[2, tokens, heads, dim]``, a function of the chunks' seeds.

    A shared chunk has the same bytes in every prompt of the family (its KV depends on its prefix only).
    """
    per_chunk = []
    for i in range(chunks):
        gen = torch.Generator().manual_seed(_chunk_seed(prompt, i) * 7_919 + i)
        shape = (LAYOUT.num_layers, 2, LAYOUT.chunk_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
        per_chunk.append(torch.randn(shape, generator=gen).to(torch.bfloat16))
    whole = torch.cat(per_chunk, dim=2)
    return ContiguousKV([whole[layer].contiguous() for layer in range(LAYOUT.num_layers)])


def empty_kv(chunks: int) -> ContiguousKV:
    """Zeroed tensors for a prompt of ``chunks`` chunks."""
    shape = (2, chunks * LAYOUT.chunk_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return ContiguousKV([torch.zeros(shape, dtype=torch.bfloat16) for _ in range(LAYOUT.num_layers)])


@dataclass(frozen=True, slots=True)
class LoadCheck:
    """One verified load.

    Attributes:
        tokens_loaded: tokens the connector reported as loaded.
        exact: whether every loaded token's KV equals the source bit for bit.
    """

    tokens_loaded: int
    exact: bool


def store_prompt(conn: KVConnector, prompt: int, chunks: int) -> int:
    """Store a prompt's KV; returns the tokens the daemon acknowledged (stored or already cached)."""
    res = conn.store(prompt_tokens(prompt, chunks), prompt_kv(prompt, chunks))
    return res.tokens_stored + res.tokens_skipped


def load_and_check(conn: KVConnector, prompt: int, chunks: int) -> LoadCheck:
    """Load a prompt's cached prefix into zeroed tensors and compare it with the source, bit for bit."""
    kv = empty_kv(chunks)
    res = conn.load(prompt_tokens(prompt, chunks), kv)
    n = res.tokens_loaded
    want = prompt_kv(prompt, chunks)
    exact = all(
        torch.equal(w[:, :n].view(torch.int16), g[:, :n].view(torch.int16))
        for w, g in zip(want.layers, kv.layers, strict=True)
    )
    return LoadCheck(n, exact)


def connect(address: str, salt: str = "faults", timeout_s: float = 10.0) -> KVConnector:
    """A connector of the runs' namespace on a new client to ``address``."""
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=timeout_s))
    return KVConnector(client, namespace(salt), ConnectorConfig())

"""``tiercache-demo``: a short in-process tour of the core on embedded defaults.

It builds the three tiers (L1 on CUDA when present, else on the CPU device; L2 in shared memory; L3 in an
LMDB file under the user's cache dir), replays a shared-system-prompt workload, prints per request how much
of the prompt was cached and in which tier, then closes and reopens the cache to show that L3 survives a
restart. (The daemon and the model-backed demo come with the daemon and engine issues.)

Primitives:
    main: the console entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from pathlib import Path

import torch

from tiercache.cache import CacheBuildConfig, CacheManager, build_cache
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.tiers.base import TierLevel
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig

logger = logging.getLogger(__name__)


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tiercache/demo`` (``~/.cache/tiercache/demo``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiercache" / "demo"


def demo_cache(
    directory: Path, chunk_bytes: int, l1_chunks: int, l2_chunks: int, l3_chunks: int
) -> CacheManager:
    """The three tiers sized in chunks, under one manager with default policies."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return build_cache(
        CacheBuildConfig(
            l1=HbmTierConfig(capacity_bytes=l1_chunks * chunk_bytes, slot_bytes=chunk_bytes, device=device),
            l2=HostTierConfig(capacity_bytes=l2_chunks * chunk_bytes, slot_bytes=chunk_bytes),
            l3=LmdbTierConfig(path=str(directory / "l3"), capacity_bytes=l3_chunks * (chunk_bytes + 4096)),
        )
    )


def run_request(cache: CacheManager, ns: Namespace, ns_id: bytes, tokens: list[int]) -> dict[str, object]:
    """Look up a prompt, load its cached prefix into engine buffers, store what had to be computed."""
    layout = ns.layout
    keys = chunk_keys(ns, tokens)
    start = time.perf_counter()
    found = cache.lookup(ns_id, keys)
    ticket = cache.acquire(ns_id, keys)
    engine_kv = torch.empty((len(keys), layout.chunk_bytes), dtype=torch.uint8)
    try:
        for ch in ticket.chunks:
            engine_kv[ch.index].copy_(ch.view)
    finally:
        cache.release(ticket.lease_id)
    loaded = len(ticket.chunks)
    gen = torch.Generator().manual_seed(len(tokens))
    for i in range(loaded, len(keys)):  # "prefill": KV the engine would compute for the uncached suffix
        engine_kv[i] = (
            torch.randn(layout.chunk_bytes // 2, generator=gen).to(torch.bfloat16).view(torch.uint8)
        )
    cache.put(ns_id, keys[loaded:], list(engine_kv[loaded:]), start_depth=loaded)
    return {
        "chunks": len(keys),
        "cached": found.chunks,
        "L1": found.by_tier.get(TierLevel.L1, 0),
        "L2": found.by_tier.get(TierLevel.L2, 0),
        "L3": found.by_tier.get(TierLevel.L3, 0),
        "ms": (time.perf_counter() - start) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="tiercache-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=default_dir(), help="where L3 lives (default: %(default)s)"
    )
    parser.add_argument(
        "--requests", type=int, default=6, help="requests sharing the system prompt (default: 6)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the L3 directory afterwards")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    layout = KVLayout(num_layers=8, num_kv_heads=8, head_dim=128, dtype=KVDtype.BFLOAT16, chunk_tokens=256)
    ns = Namespace(model_id="demo/llama-like-8l", revision="v1", layout=layout, tokenizer_id="demo-tok")
    system = list(range(10_000, 10_000 + 4 * layout.chunk_tokens))  # a 1024-token system prompt
    if args.dir.exists() and not args.keep:
        shutil.rmtree(args.dir)
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"tiercache demo: {layout.chunk_bytes / 2**20:.0f} MiB chunks, L3 in {args.dir}")
    print(f"{'request':<22}{'chunks':>7}{'cached':>8}{'in L1':>7}{'in L2':>7}{'in L3':>7}{'ms':>9}")
    cache = demo_cache(args.dir, layout.chunk_bytes, l1_chunks=6, l2_chunks=12, l3_chunks=64)
    try:
        ns_id = cache.register_namespace(ns)
        for r in range(args.requests):
            user = [20_000 + 1000 * r + t for t in range(2 * layout.chunk_tokens)]
            _print_row(f"shared-prompt #{r}", run_request(cache, ns, ns_id, system + user))
        cache.flush()
    finally:
        cache.close()
    cache = demo_cache(args.dir, layout.chunk_bytes, l1_chunks=6, l2_chunks=12, l3_chunks=64)
    try:
        ns_id = cache.register_namespace(ns)
        user = [20_000 + t for t in range(2 * layout.chunk_tokens)]
        _print_row("after restart #0", run_request(cache, ns, ns_id, system + user))
        stats = cache.stats()
    finally:
        cache.close()
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    for t in stats.tiers:
        print(
            f"{t.level.name}: {t.chunks} chunks, {t.used_bytes / 2**20:.0f}/{t.capacity_bytes / 2**20:.0f} MiB, "
            f"hits {t.hits}, misses {t.misses}, promotions {t.promotions}, demotions {t.demotions}"
        )
    return 0


def _print_row(name: str, row: dict[str, object]) -> None:
    print(
        f"{name:<22}{row['chunks']:>7}{row['cached']:>8}{row['L1']:>7}{row['L2']:>7}{row['L3']:>7}{row['ms']:>9.1f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())

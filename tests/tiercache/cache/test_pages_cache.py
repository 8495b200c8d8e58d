"""The cache over a paged L2: namespaces of different chunk sizes share it, and a store that finds the free
pages split into short runs evicts on (in policy order) until a run is long enough."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator

import pytest
import torch

from tiercache.cache import CacheConfig, CacheManager
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies import EvictionPolicyKind
from tiercache.stats import EventKind
from tiercache.tiers.base import TierLevel
from tiercache.tiers.host import HostTier, HostTierConfig

PAGE = 4096
PAGES = 64


def _namespace(head_dim: int) -> Namespace:
    layout = KVLayout(
        num_layers=2,
        num_kv_heads=2,
        head_dim=head_dim,
        dtype=KVDtype.BFLOAT16,
        chunk_tokens=16,
        page_tokens=16,
    )
    return Namespace(model_id=f"test/pages-{head_dim}", revision="r1", layout=layout, tokenizer_id="tok")


SMALL, LARGE = _namespace(16), _namespace(64)  # 4 KiB (one page) and 16 KiB (four pages) chunks


def _payload(key: bytes, nbytes: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def cache() -> Iterator[CacheManager]:
    l2 = HostTier(
        HostTierConfig(
            capacity_bytes=PAGES * PAGE,
            slot_bytes=16 * PAGE,
            page_bytes=PAGE,
            segment_prefix=f"tc-pcache-{secrets.token_hex(3)}",
            prefault=False,
        )
    )
    now = [1000.0]
    # LRU pinned: the tests name their victims in LRU order
    lru = CacheConfig(eviction_policy=EvictionPolicyKind.LRU)
    manager = CacheManager([l2], lru, clock=lambda: now[0])
    yield manager
    manager.close()


def _keys(ns: Namespace, n: int, seed: int) -> list[bytes]:
    return chunk_keys(ns, [seed * 1_000_003 + i for i in range(n * ns.layout.chunk_tokens)])


def _put(cache: CacheManager, ns_id: bytes, ns: Namespace, keys: list[bytes]) -> int:
    nbytes = ns.layout.chunk_bytes
    return sum(cache.put(ns_id, [k], [_payload(k, nbytes)], depth) for depth, k in enumerate(keys))


def _held(cache: CacheManager, ns_id: bytes, ns: Namespace, keys: list[bytes]) -> list[bool]:
    out = []
    for depth, key in enumerate(keys):
        (got,) = cache.get(ns_id, [key]) if depth == 0 or out[-1] else [None]
        if got is not None:
            assert torch.equal(got, _payload(key, ns.layout.chunk_bytes)), "served a wrong byte"
        out.append(got is not None)
    return out


def test_two_chunk_sizes_fill_the_tier_and_report_it(cache: CacheManager) -> None:
    assert SMALL.layout.chunk_bytes == PAGE and LARGE.layout.chunk_bytes == 4 * PAGE
    small_id, large_id = cache.register_namespace(SMALL), cache.register_namespace(LARGE)
    small, large = _keys(SMALL, 32, 1), _keys(LARGE, 8, 2)
    assert _put(cache, small_id, SMALL, small) == 32 and _put(cache, large_id, LARGE, large) == 8
    stats = cache.stats().tier(TierLevel.L2)
    assert stats.payload_bytes == stats.capacity_bytes == PAGES * PAGE and stats.utilisation == 1.0
    assert _held(cache, small_id, SMALL, small) == [True] * 32
    assert _held(cache, large_id, LARGE, large) == [True] * 8


def test_a_store_into_fragmented_pages_evicts_until_a_run_fits(cache: CacheManager) -> None:
    small_id, large_id = cache.register_namespace(SMALL), cache.register_namespace(LARGE)
    removed: list[bytes] = []
    cache.subscribe(lambda e: removed.append(e.key) if e.kind is EventKind.REMOVED and e.evicted else None)
    chains = [_keys(SMALL, 1, seed) for seed in range(PAGES)]  # 64 one-chunk prompts: one page each
    for chain in chains:
        assert _put(cache, small_id, SMALL, chain) == 1
    for chain in chains[::2]:
        assert _held(cache, small_id, SMALL, chain) == [True]  # the even pages are the recent ones
    (big,) = _keys(LARGE, 1, 99)
    assert _put(cache, large_id, LARGE, [big]) == 1
    # LRU frees the odd pages first: 32 free pages, no two in a row; then the least recent even chunks go
    # (pages 0 and 2), which merges pages 0-3 into a run that holds the large chunk.
    odd = [c[0] for c in chains[1::2]]
    assert removed == [*odd, chains[0][0], chains[2][0]]
    assert _held(cache, large_id, LARGE, [big]) == [True]
    kept = [seed for seed, chain in enumerate(chains) if _held(cache, small_id, SMALL, chain) == [True]]
    assert kept == list(range(4, PAGES, 2))
    stats = cache.stats().tier(TierLevel.L2)
    assert stats.payload_bytes == (len(kept) + 4) * PAGE and stats.chunks == len(kept) + 1

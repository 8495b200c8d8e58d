"""The same-host store's checked copy (:mod:`tiercache.connector.checked_copy`): the engine's KV lands in
the slots exactly as the plain gather writes it, and each chunk's checksum is xxh3-64 of its slot's bytes."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import xxhash

from tiercache.connector.checked_copy import kv_to_slots_checked
from tiercache.connector.kv import ContiguousKV, PagedKV, kv_to_chunk
from tiercache.connector.results import SlotRef
from tiercache.layout import KVDtype, KVLayout

# 3 layers of K and V, 2 x 8 x 16 bf16 per token: 768 B per token, parts of 24 KiB (not a block multiple).
LAYOUT = KVLayout(
    num_layers=3, num_kv_heads=8, head_dim=16, dtype=KVDtype.BFLOAT16, chunk_tokens=32, page_tokens=16
)
CHUNKS = 5


def _kv(seed: int) -> ContiguousKV:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, CHUNKS * LAYOUT.chunk_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    return ContiguousKV(
        [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(LAYOUT.num_layers)]
    )


def test_slots_hold_the_gathered_chunks_and_their_checksums() -> None:
    kv = _kv(1)
    pool = torch.zeros(CHUNKS + 2, LAYOUT.chunk_bytes, dtype=torch.uint8)
    refs = [SlotRef(index=i, slot=(i * 3) % (CHUNKS + 2), nbytes=LAYOUT.chunk_bytes) for i in (0, 2, 3, 4)]
    sums = kv_to_slots_checked(LAYOUT, kv, refs, lambda r: pool[r.slot])
    assert sums is not None and sorted(sums) == [0, 2, 3, 4]
    for ref in refs:
        want = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(LAYOUT, kv, ref.index, want)
        assert torch.equal(pool[ref.slot], want)
        assert sums[ref.index] == xxhash.xxh3_64_intdigest(want.numpy().tobytes())


def test_a_kv_that_is_not_contiguous_cpu_memory_is_left_to_the_plain_copy() -> None:
    blocks = torch.zeros(2, 8, LAYOUT.page_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim, dtype=torch.bfloat16)
    paged = PagedKV([blocks] * LAYOUT.num_layers, block_ids=list(range(4)))
    pool = torch.zeros(1, LAYOUT.chunk_bytes, dtype=torch.uint8)
    refs = [SlotRef(index=0, slot=0, nbytes=LAYOUT.chunk_bytes)]
    assert kv_to_slots_checked(LAYOUT, paged, refs, lambda r: pool[r.slot]) is None
    assert not pool.any()  # nothing copied


def test_a_large_store_shared_with_the_helper_lands_every_chunk() -> None:
    kv = _kv(2)
    pool = torch.zeros(CHUNKS, LAYOUT.chunk_bytes, dtype=torch.uint8)
    refs = [SlotRef(index=i, slot=CHUNKS - 1 - i, nbytes=LAYOUT.chunk_bytes) for i in range(CHUNKS)]
    with ThreadPoolExecutor(1) as helper:
        sums = kv_to_slots_checked(LAYOUT, kv, refs, lambda r: pool[r.slot], helper, split_min_bytes=0)
    assert sums is not None and sorted(sums) == list(range(CHUNKS))
    for ref in refs:
        want = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(LAYOUT, kv, ref.index, want)
        assert torch.equal(pool[ref.slot], want)
        assert sums[ref.index] == xxhash.xxh3_64_intdigest(want.numpy().tobytes())


def test_a_busy_helper_does_not_hold_a_store_up() -> None:
    """The helper's thread is busy (e.g. a load of another request): the caller copies every chunk itself
    and returns without waiting for it (before, half the chunks waited for the helper: this hung)."""
    kv = _kv(4)
    pool = torch.zeros(CHUNKS, LAYOUT.chunk_bytes, dtype=torch.uint8)
    refs = [SlotRef(index=i, slot=i, nbytes=LAYOUT.chunk_bytes) for i in range(CHUNKS)]
    release = threading.Event()
    with ThreadPoolExecutor(1) as helper:
        busy = helper.submit(release.wait)
        try:
            sums = kv_to_slots_checked(LAYOUT, kv, refs, lambda r: pool[r.slot], helper, split_min_bytes=0)
        finally:
            release.set()
        assert busy.result()
    assert sums is not None and len(sums) == CHUNKS
    for ref in refs:
        want = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(LAYOUT, kv, ref.index, want)
        assert torch.equal(pool[ref.slot], want)


class _CountingHelper(ThreadPoolExecutor):
    """A real one-thread executor that counts the work handed to it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_a_small_store_stays_on_the_calling_thread() -> None:
    kv = _kv(3)
    pool = torch.zeros(CHUNKS, LAYOUT.chunk_bytes, dtype=torch.uint8)
    refs = [SlotRef(index=i, slot=i, nbytes=LAYOUT.chunk_bytes) for i in range(CHUNKS)]
    with _CountingHelper() as helper:
        sums = kv_to_slots_checked(LAYOUT, kv, refs, lambda r: pool[r.slot], helper)  # far below the split
        assert helper.submitted == 0
        sums_split = kv_to_slots_checked(LAYOUT, kv, refs, lambda r: pool[r.slot], helper, split_min_bytes=0)
        assert helper.submitted == 1
    assert sums is not None and sums == sums_split and len(sums) == CHUNKS

"""A large batch's copies in and out of a slot tier shared with helper threads: the same bytes and checksums
as on one thread, and a flipped byte still caught (the helpers run only on hosts of 4 cores or more, so this
forces them)."""

from __future__ import annotations

import threading

import pytest
import torch

from tiercache.tiers.base import TierLevel
from tiercache.tiers.slot_copies import PARALLEL_MIN_BYTES, CopyPool, copy_workers
from tiercache.tiers.slots import SlotPoolTier

CHUNK = 4 << 20
CHUNKS = 8  # 32 MiB: above PARALLEL_MIN_BYTES


def _tier(copy_threads: int) -> SlotPoolTier:
    pool = torch.zeros((CHUNKS + 2, CHUNK), dtype=torch.uint8)
    return SlotPoolTier(TierLevel.L2, pool, checksums=True, copy_threads=copy_threads)


def _payload(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=gen) for _ in range(CHUNKS)]


def test_helpers_by_host_size() -> None:
    assert [copy_workers(n) for n in (1, 2, 3, 4, 8, 16, 64)] == [0, 0, 0, 1, 3, 7, 7]


@pytest.mark.parametrize("threads", [0, 3])
def test_a_batch_copied_on_helpers_round_trips_with_the_same_checksums(threads: int) -> None:
    assert CHUNK * CHUNKS >= PARALLEL_MIN_BYTES
    tier, single = _tier(threads), _tier(0)
    ids = [bytes([i]) * 32 for i in range(CHUNKS)]
    srcs = _payload(7)
    try:
        for t in (tier, single):
            t.commit_from(t.reserve(ids, [CHUNK] * CHUNKS), srcs)
        assert [tier.checksum(i) for i in ids] == [single.checksum(i) for i in ids]
        dsts = [torch.empty(CHUNK, dtype=torch.uint8) for _ in ids]
        assert tier.read_into(ids, dsts) == [True] * CHUNKS
        assert all(torch.equal(d, s) for d, s in zip(dsts, srcs, strict=True))
        # a flipped byte in one chunk: that chunk alone is reported absent (and deleted), the rest serve
        row = tier._host_row(tier._committed[ids[5]].where, CHUNK)
        row[CHUNK // 2] ^= 1
        assert tier.read_into(ids, dsts) == [i != 5 for i in range(CHUNKS)]
        assert tier.checksum(ids[5]) is None
    finally:
        tier.close()
        single.close()


def test_a_failing_copy_waits_for_the_others_and_raises() -> None:
    pool = CopyPool(2, "test-copy")
    done: list[int] = []
    release = threading.Event()

    def slow(i: int) -> int:
        release.wait(10)
        done.append(i)
        return i

    def bad() -> int:
        release.set()
        raise ValueError("copy failed")

    try:
        with pytest.raises(ValueError, match="copy failed"):
            pool.run([bad, lambda: slow(1), lambda: slow(2)], PARALLEL_MIN_BYTES)
        assert sorted(done) == [1, 2]  # both finished before run() returned
        assert pool.run([lambda: 1, lambda: 2], 0) == [1, 2]  # small: on this thread
    finally:
        pool.close()

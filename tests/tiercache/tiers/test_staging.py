"""The staging pool: buffers are reused by exact size, up to the idle budget."""

from __future__ import annotations

import torch

from tiercache.tiers.staging import StagingPool


def test_a_returned_buffer_is_reused_for_the_same_size_only() -> None:
    pool = StagingPool(budget_bytes=1 << 20)
    first = pool.take(4096)
    assert first.dtype == torch.uint8 and first.shape == (4096,) and first.device.type == "cpu"
    pool.give(first)
    assert pool.take(1024) is not first  # another size: a fresh buffer
    assert pool.take(4096) is first
    assert pool.take(4096) is not first  # taken already


def test_buffers_beyond_the_budget_are_not_kept() -> None:
    pool = StagingPool(budget_bytes=6000)
    a, b = pool.take(4096), pool.take(4096)
    pool.give(a)
    pool.give(b)  # 8192 > 6000: dropped
    assert pool.take(4096) is a
    assert pool.take(4096) is not b

"""The staging pool: buffers are reused by exact size, up to the idle budget."""

from __future__ import annotations

import pytest
import torch

from tiercache.tiers.staging import ALIGN_BYTES, StagingPool


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


def test_the_payload_of_every_buffer_starts_on_a_cache_line() -> None:
    pool = StagingPool(budget_bytes=1 << 20, payload_offset=40)
    buffers = [pool.take(n) for n in (41, 4096, 4136, 262184)]
    for buf in buffers:
        assert (buf.data_ptr() + 40) % ALIGN_BYTES == 0
        assert buf.is_contiguous() and buf.dim() == 1
    assert [b.numel() for b in buffers] == [41, 4096, 4136, 262184]
    pool.give(buffers[1])
    again = pool.take(4096)
    assert again is buffers[1] and (again.data_ptr() + 40) % ALIGN_BYTES == 0


def test_buffers_do_not_overlap_and_hold_what_is_written() -> None:
    pool = StagingPool(budget_bytes=1 << 20, payload_offset=40)
    a, b = pool.take(1000), pool.take(1000)
    a.fill_(1)
    b.fill_(2)
    assert int(a.sum()) == 1000 and int(b.sum()) == 2000


def test_a_negative_payload_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="payload_offset"):
        StagingPool(budget_bytes=1, payload_offset=-1)

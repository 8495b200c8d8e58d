"""The memcpy ceiling: every chunk really copied, the faster of torch's and numpy's copy kept on the CPU."""

from __future__ import annotations

import torch

from tiercache.bench.ceilings import CeilingKind, measure_memcpy


def test_memcpy_copies_every_chunk_and_keeps_the_faster_way() -> None:
    gen = torch.Generator().manual_seed(3)
    srcs = [torch.randint(0, 256, (64 << 10,), dtype=torch.uint8, generator=gen) for _ in range(5)]
    dsts = [torch.zeros_like(s) for s in srcs]
    result = measure_memcpy(srcs, dsts, batch=2, warmup_rounds=0)
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts, strict=True))
    assert result.kind is CeilingKind.MEMCPY and result.label == "memcpy(cpu)"
    assert result.chunk_bytes == 64 << 10 and result.timing.total_bytes == 5 * (64 << 10)
    assert result.timing.calls == 3  # batches of 2, 2 and 1
    assert result.note in {
        "faster of torch copy_ and numpy copyto: torch copy_",
        "faster of torch copy_ and numpy copyto: numpy copyto",
    }

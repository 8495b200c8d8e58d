"""KV copy helpers: chunk buffers <-> engine tensors, contiguous and paged (vLLM) layouts, bit-exact."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch

import tiercache.connector.kv as kv_module
from tiercache.connector.kv import (
    ContiguousKV,
    PagedKV,
    chunk_parts,
    chunk_to_kv,
    chunks_to_kv,
    kv_to_chunk,
    kv_to_run,
    run_to_kv,
)
from tiercache.connector.kv_check import check_kv
from tiercache.connector.results import SegmentInfo, SlotRef
from tiercache.connector.segments import SlotAccess
from tiercache.errors import InvalidArgumentError
from tiercache.layout import KVDtype, KVLayout

LAYOUTS = {
    "bf16-gqa": KVLayout(3, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=4),
    "fp32-mha": KVLayout(2, 4, 8, KVDtype.FLOAT32, chunk_tokens=8, page_tokens=2),
    "bf16-mla": KVLayout(2, 1, 32, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=4, mla=True),
    "fp16-one-page": KVLayout(2, 2, 8, KVDtype.FLOAT16, chunk_tokens=8, page_tokens=8),
}


def _rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)


def _contiguous(layout: KVLayout, tokens: int, seed: int) -> ContiguousKV:
    shape = (tokens, layout.head_dim) if layout.mla else (2, tokens, layout.num_kv_heads, layout.head_dim)
    return ContiguousKV([_rand(shape, layout.dtype.torch_dtype, seed + i) for i in range(layout.num_layers)])


def _paged(layout: KVLayout, num_blocks: int, block_ids: list[int], seed: int) -> PagedKV:
    b = layout.page_tokens
    shape = (
        (num_blocks, b, layout.head_dim)
        if layout.mla
        else (2, num_blocks, b, layout.num_kv_heads, layout.head_dim)
    )
    layers = [_rand(shape, layout.dtype.torch_dtype, seed + i) for i in range(layout.num_layers)]
    return PagedKV(layers, block_ids)


def _token(layout: KVLayout, kv: ContiguousKV | PagedKV, layer: int, t: int) -> torch.Tensor:
    """The KV of token ``t`` in ``layer``, read token by token (independent of the code under test)."""
    x = kv.layers[layer]
    if isinstance(kv, ContiguousKV):
        return x[t] if layout.mla else x[:, t]
    block, off = kv.block_ids[t // layout.page_tokens], t % layout.page_tokens
    return x[block, off] if layout.mla else x[:, block, off]


def _reference_chunk(layout: KVLayout, kv: ContiguousKV | PagedKV, chunk: int) -> bytes:
    """Expected chunk bytes: ``[layer][k|v][token][head][dim]`` (MLA ``[layer][token][dim]``)."""
    c = layout.chunk_tokens
    out = bytearray()
    for layer in range(layout.num_layers):
        toks = [_token(layout, kv, layer, t) for t in range(chunk * c, (chunk + 1) * c)]
        stacked = torch.stack(toks, dim=0 if layout.mla else 1).contiguous()
        out += stacked.view(-1).view(torch.uint8).numpy().tobytes()
    return bytes(out)


def _chunk_buf(layout: KVLayout, seed: int) -> torch.Tensor:
    n = layout.chunk_bytes // layout.dtype.itemsize
    return _rand((n,), layout.dtype.torch_dtype, seed).view(torch.uint8)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_contiguous_out_matches_reference_and_round_trips(name: str) -> None:
    layout = LAYOUTS[name]
    kv = _contiguous(layout, tokens=3 * layout.chunk_tokens + 5, seed=1)
    check_kv(layout, kv, 3)
    for chunk in range(3):
        buf = torch.empty(layout.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(layout, kv, chunk, buf)
        assert buf.numpy().tobytes() == _reference_chunk(layout, kv, chunk)
        dst = _contiguous(layout, tokens=3 * layout.chunk_tokens, seed=99)
        chunk_to_kv(layout, buf, dst, chunk)
        assert _reference_chunk(layout, dst, chunk) == buf.numpy().tobytes()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_chunk_parts_are_views_of_the_kv_holding_the_chunk_bytes(name: str) -> None:
    layout = LAYOUTS[name]
    kv = _contiguous(layout, tokens=3 * layout.chunk_tokens + 5, seed=2)
    parts = chunk_parts(layout, kv)
    assert parts is not None
    for chunk in range(3):
        views = parts(chunk)
        assert b"".join(views) == _reference_chunk(layout, kv, chunk)
        kv.layers[-1].add_(1)  # views, not copies: they see the engine's writes
        assert b"".join(views) == _reference_chunk(layout, kv, chunk)


def test_chunk_parts_of_a_kv_that_is_not_contiguous_cpu_memory_is_none() -> None:
    layout = LAYOUTS["bf16-gqa"]
    assert chunk_parts(layout, _paged(layout, 8, [0, 1, 2, 3], seed=3)) is None
    kv = _contiguous(layout, tokens=2 * layout.chunk_tokens, seed=3)
    assert chunk_parts(layout, ContiguousKV([t.to(torch.float32) for t in kv.layers])) is None
    assert chunk_parts(layout, ContiguousKV([t.reshape(2, -1, 16, 2) for t in kv.layers])) is None  # rows
    assert chunk_parts(layout, ContiguousKV(list(kv.layers[:2]))) is None  # too few layers
    strided = [t.transpose(2, 3).contiguous().transpose(2, 3) for t in kv.layers]  # same shape, other strides
    assert chunk_parts(layout, ContiguousKV(strided)) is None
    assert b"".join(chunk_parts(layout, kv)(1)) == _reference_chunk(layout, ContiguousKV(strided), 1)  # type: ignore[misc]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize(
    "block_ids",
    [
        pytest.param("consecutive", id="consecutive"),
        pytest.param("scattered", id="scattered"),
        pytest.param("runs", id="runs"),
    ],
)
def test_paged_out_and_in_are_bit_exact(name: str, block_ids: str) -> None:
    layout = LAYOUTS[name]
    per = layout.chunk_tokens // layout.page_tokens
    need = 3 * per
    num_blocks = 4 * need
    if block_ids == "consecutive":
        ids = list(range(5, 5 + need))
    elif block_ids == "scattered":
        gen = torch.Generator().manual_seed(7)
        ids = torch.randperm(num_blocks, generator=gen)[:need].tolist()
    else:  # each chunk: two runs of consecutive blocks (or one block each when a chunk is one page)
        half = max(1, per // 2)
        ids = [(7 * (i // half) + i % half) % num_blocks for i in range(need)]
    src = _paged(layout, num_blocks, ids, seed=3)
    check_kv(layout, src, 3)
    dst = _paged(layout, num_blocks, ids, seed=50)
    for chunk in range(3):
        buf = torch.empty(layout.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(layout, src, chunk, buf)
        assert buf.numpy().tobytes() == _reference_chunk(layout, src, chunk)
        chunk_to_kv(layout, buf, dst, chunk)
        assert _reference_chunk(layout, dst, chunk) == buf.numpy().tobytes()


@pytest.mark.parametrize("name", ["bf16-gqa", "bf16-mla"])
def test_load_touches_only_the_chunk_tokens(name: str) -> None:
    layout = LAYOUTS[name]
    kv = _contiguous(layout, tokens=2 * layout.chunk_tokens, seed=11)
    before = [t.clone() for t in kv.layers]
    buf = _chunk_buf(layout, seed=5)
    chunk_to_kv(layout, buf, kv, 1)
    c = layout.chunk_tokens
    for layer, (old, new) in enumerate(zip(before, kv.layers)):
        untouched = (new[:c], old[:c]) if layout.mla else (new[:, :c], old[:, :c])
        assert torch.equal(*untouched), layer
    assert _reference_chunk(layout, kv, 1) == buf.numpy().tobytes()


def test_paged_load_touches_only_the_request_blocks() -> None:
    layout = LAYOUTS["bf16-gqa"]
    ids = [9, 2, 7, 4]  # one chunk of 4 pages
    kv = _paged(layout, 12, ids, seed=21)
    before = [t.clone() for t in kv.layers]
    buf = _chunk_buf(layout, seed=8)
    chunk_to_kv(layout, buf, kv, 0)
    others = [b for b in range(12) if b not in ids]
    for old, new in zip(before, kv.layers):
        assert torch.equal(old[:, others], new[:, others])
    assert _reference_chunk(layout, kv, 0) == buf.numpy().tobytes()


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_layer_of_many_chunks_lands_as_chunk_by_chunk_copies_do(name: str) -> None:
    # chunks_to_kv (a layerwise load's host path: numpy views made once) against chunk_to_kv per chunk, with
    # scattered blocks, a load that starts inside the first chunk (first_block) and a last chunk in part.
    layout = LAYOUTS[name]
    per = layout.chunk_tokens // layout.page_tokens
    gen = torch.Generator().manual_seed(9)
    ids = torch.randperm(6 * per, generator=gen)[: 3 * per - (per > 1)].tolist()
    first = 1 if per > 1 else 0
    bufs = [(i, _chunk_buf(layout, seed=30 + i)) for i in range(3)]
    bulk, each = (PagedKV(_paged(layout, 6 * per, ids, seed=70).layers, ids, first) for _ in range(2))
    before = [t.clone() for t in bulk.layers]
    for layer in range(layout.num_layers):
        chunks_to_kv(layout, bufs, bulk, layer)
        for index, buf in bufs:
            chunk_to_kv(layout, buf, each, index, layers=(layer,))
    for a, b, old in zip(bulk.layers, each.layers, before):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        kept = ids[:first]  # before first_block: the engine computed them, nothing is written there
        assert torch.equal(a[kept] if layout.mla else a[:, kept], old[kept] if layout.mla else old[:, kept])
    assert not torch.equal(bulk.layers[0], before[0])
    with pytest.raises(InvalidArgumentError, match="layer"):
        chunks_to_kv(layout, bufs, bulk, layout.num_layers)
    with pytest.raises(InvalidArgumentError, match="chunk_buf"):
        chunks_to_kv(layout, [(0, bufs[0][1][:-2])], bulk, 0)


def test_single_layer_copies_leave_other_layers_alone() -> None:
    layout = LAYOUTS["fp32-mha"]
    kv = _contiguous(layout, tokens=layout.chunk_tokens, seed=2)
    before = kv.layers[0].clone()
    buf = _chunk_buf(layout, seed=4)
    chunk_to_kv(layout, buf, kv, 0, layers=[1])
    assert torch.equal(kv.layers[0], before)
    start, stop = layout.layer_range(1)
    assert (
        kv.layers[1].contiguous().view(torch.uint8).view(-1).numpy().tobytes()
        == buf[start:stop].numpy().tobytes()
    )


def test_check_kv_names_the_bad_argument() -> None:
    layout = LAYOUTS["bf16-gqa"]
    good = _contiguous(layout, tokens=32, seed=1)
    with pytest.raises(InvalidArgumentError, match=r"kv\.layers:"):
        check_kv(layout, ContiguousKV(good.layers[:2]), 1)
    with pytest.raises(InvalidArgumentError, match=r"kv\.layers\[1\].*dtype"):
        check_kv(layout, ContiguousKV([good.layers[0], good.layers[1].float(), good.layers[2]]), 1)
    with pytest.raises(InvalidArgumentError, match=r"kv\.layers\[0\].*shape"):
        check_kv(layout, ContiguousKV([t.transpose(1, 2) for t in good.layers]), 1)
    with pytest.raises(InvalidArgumentError, match=r"kv\.layers\[0\].*32 tokens"):
        check_kv(layout, good, 3)
    paged = _paged(layout, 8, [0, 1, 2, 3], seed=1)
    with pytest.raises(InvalidArgumentError, match=r"kv\.block_ids.*need 8"):
        check_kv(layout, paged, 2)
    with pytest.raises(InvalidArgumentError, match=r"kv\.block_ids.*block 8"):
        check_kv(layout, PagedKV(paged.layers, [0, 1, 2, 8]), 1)
    wrong_page = KVLayout(3, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=8)
    with pytest.raises(InvalidArgumentError, match=r"kv\.layers\[0\].*shape"):
        check_kv(wrong_page, paged, 1)
    with pytest.raises(InvalidArgumentError, match="kv:"):
        check_kv(layout, good.layers, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="chunk_buf"):
        chunk_to_kv(layout, torch.zeros(layout.chunk_bytes - 1, dtype=torch.uint8), good, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_engine_tensors_round_trip_through_a_host_buffer(paged: bool) -> None:
    layout = LAYOUTS["bf16-gqa"]
    per = layout.chunk_tokens // layout.page_tokens
    ids = [5, 1, 2, 9, 3, 4, 0, 8]  # scattered: the cross-device path copies run by run
    src_cpu = (
        _paged(layout, 10, ids, seed=31) if paged else _contiguous(layout, 2 * layout.chunk_tokens, seed=31)
    )
    dst_cpu = (
        _paged(layout, 10, ids, seed=32) if paged else _contiguous(layout, 2 * layout.chunk_tokens, seed=32)
    )

    def on_cuda(kv: ContiguousKV | PagedKV) -> ContiguousKV | PagedKV:
        layers = [t.cuda() for t in kv.layers]
        return PagedKV(layers, kv.block_ids) if isinstance(kv, PagedKV) else ContiguousKV(layers)

    src, dst = on_cuda(src_cpu), on_cuda(dst_cpu)
    check_kv(layout, src, 2)
    assert len(ids) == 2 * per
    for chunk in range(2):
        buf = torch.empty(layout.chunk_bytes, dtype=torch.uint8).pin_memory()
        kv_to_chunk(layout, src, chunk, buf)
        torch.cuda.synchronize()
        assert buf.numpy().tobytes() == _reference_chunk(layout, src_cpu, chunk)
        chunk_to_kv(layout, buf, dst, chunk)
        torch.cuda.synchronize()
        back = (
            PagedKV([t.cpu() for t in dst.layers], ids)
            if paged
            else ContiguousKV([t.cpu() for t in dst.layers])
        )
        assert _reference_chunk(layout, back, chunk) == buf.numpy().tobytes()


def _slot_runs(
    layout: KVLayout, slot_bytes: int, positions: list[int]
) -> tuple[list[tuple[int, torch.Tensor]], list[tuple[int, torch.Tensor]]]:
    """Chunk buffers ``(chunk index, 1-D view)`` at ``positions`` (slot numbers) of one segment-like tensor,
    and the same slots as the data plane's runs (:meth:`~tiercache.connector.segments.SlotAccess.runs`)."""
    slots = max(positions) + 2
    memory = torch.zeros(slot_bytes * slots, dtype=torch.uint8)
    access = SlotAccess(SegmentInfo("test", slot_bytes, slots, memory.numel()), memory)
    refs = [SlotRef(i, p, layout.chunk_bytes) for i, p in enumerate(positions)]
    return [(ref.index, access.view(ref)) for ref in refs], access.runs(refs)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_runs_move_the_same_bytes_as_chunk_by_chunk_copies(name: str) -> None:
    layout = LAYOUTS[name]
    tokens = 5 * layout.chunk_tokens
    src = _contiguous(layout, tokens, seed=11)
    bufs, runs = _slot_runs(layout, layout.chunk_bytes + 32, [7, 8, 9, 1, 2])  # chunks 0-2 and 3-4
    assert [first for first, _ in runs] == [0, 3]
    for first, run in runs:
        kv_to_run(layout, src, first, run)
    for index, buf in bufs:
        assert buf.numpy().tobytes() == _reference_chunk(layout, src, index)
    dst = _contiguous(layout, tokens, seed=12)
    for first, run in runs:
        run_to_kv(layout, run, dst, first)
    for index, buf in bufs:
        assert _reference_chunk(layout, dst, index) == buf.numpy().tobytes()
    one_layer = _contiguous(layout, tokens, seed=13)
    before = [t.clone() for t in one_layer.layers]
    run_to_kv(layout, runs[0][1], one_layer, 0, layers=[1])
    assert torch.equal(one_layer.layers[0], before[0])
    assert not torch.equal(one_layer.layers[1], before[1])


class _CountingHelper(ThreadPoolExecutor):
    """A real one-thread executor that counts what it was given."""

    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, fn: Callable[..., object], /, *args: object, **kwargs: object) -> Future[Any]:
        self.jobs += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_runs_split_over_a_helper_thread_move_the_same_bytes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = LAYOUTS[name]
    tokens = 4 * layout.chunk_tokens
    src = _contiguous(layout, tokens, seed=21)
    ((first, run),) = _slot_runs(layout, layout.chunk_bytes + 32, [3, 4, 5, 6])[1]
    with _CountingHelper() as helper:
        kv_to_run(layout, src, first, run, helper=helper)  # below SPLIT_MIN_BYTES: all on this thread
        assert helper.jobs == 0
        monkeypatch.setattr(kv_module, "SPLIT_MIN_BYTES", run.nbytes)
        run.zero_()
        kv_to_run(layout, src, first, run, helper=helper)
        for i in range(4):
            assert run[i].numpy().tobytes() == _reference_chunk(layout, src, i)
        dst = _contiguous(layout, tokens, seed=22)
        run_to_kv(layout, run, dst, first, helper=helper)
        for i in range(4):
            assert _reference_chunk(layout, dst, i) == run[i].numpy().tobytes()
        assert helper.jobs == 2  # one half of the layers each way
        one_layer = _contiguous(layout, tokens, seed=23)
        before = [t.clone() for t in one_layer.layers]
        run_to_kv(layout, run, one_layer, 0, layers=[1], helper=helper)  # one layer: nothing to split
        assert helper.jobs == 2
        assert torch.equal(one_layer.layers[0], before[0]) and torch.equal(one_layer.layers[1], dst.layers[1])


def test_runs_into_a_paged_kv_and_bad_runs() -> None:
    layout = LAYOUTS["bf16-gqa"]
    per = layout.chunk_tokens // layout.page_tokens
    ids = list(range(20, 20 + 2 * per))
    src = _paged(layout, 64, ids, seed=21)
    bufs, ((first, run),) = _slot_runs(layout, layout.chunk_bytes, [0, 1])
    kv_to_run(layout, src, first, run)
    dst = _paged(layout, 64, ids, seed=22)
    run_to_kv(layout, run, dst, first)
    for index, buf in bufs:
        assert (
            buf.numpy().tobytes()
            == _reference_chunk(layout, src, index)
            == _reference_chunk(layout, dst, index)
        )
    with pytest.raises(InvalidArgumentError, match="run"):
        run_to_kv(layout, run[:, :-2], _contiguous(layout, 2 * layout.chunk_tokens, 1), 0)
    with pytest.raises(InvalidArgumentError, match="layer"):
        run_to_kv(
            layout, torch.zeros(1, layout.chunk_bytes, dtype=torch.uint8), _contiguous(layout, 16, 1), 0, [9]
        )


@pytest.mark.parametrize("odd", ["requires_grad", "strided_last_dim"])
def test_runs_are_bit_exact_with_engine_tensors_numpy_cannot_view(odd: str) -> None:
    """Host runs copy through numpy byte views; an engine tensor without one (strided innermost dimension)
    or one that requires grad still moves the same bytes."""
    layout = LAYOUTS["bf16-gqa"]
    tokens = 2 * layout.chunk_tokens
    plain = _contiguous(layout, tokens, seed=31)
    if odd == "requires_grad":
        layers = [t.float().requires_grad_(True) for t in plain.layers]
        layout = KVLayout(3, 2, 16, KVDtype.FLOAT32, chunk_tokens=16, page_tokens=4)
    else:  # same values, the head_dim axis strided in memory
        layers = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in plain.layers]
        assert layers[0].stride(-1) != 1
    src = ContiguousKV(layers)
    bufs, ((first, run),) = _slot_runs(layout, layout.chunk_bytes, [3, 4])
    kv_to_run(layout, src, first, run)
    for index, buf in bufs:
        assert buf.numpy().tobytes() == _reference_chunk(layout, src, index)
    dst = ContiguousKV([torch.zeros_like(t).detach() for t in layers])
    if odd == "strided_last_dim":
        dst = ContiguousKV([t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in dst.layers])
    run_to_kv(layout, run, dst, first)
    for index, buf in bufs:
        assert _reference_chunk(layout, dst, index) == buf.numpy().tobytes()


def test_paged_kv_given_as_block_planes_is_checked() -> None:
    layout = KVLayout(2, 2, 8, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=16)
    block = layout.layer_bytes // 2  # bytes of one block of one layer
    good = [torch.zeros(1, 6, block, dtype=torch.uint8) for _ in range(2)]
    check_kv(layout, PagedKV.of_blocks(good, [0, 5]), 1)
    with pytest.raises(InvalidArgumentError) as info:
        check_kv(
            layout, PagedKV.of_blocks([good[0], torch.zeros(1, 6, block + 4, dtype=torch.uint8)], [0, 5]), 1
        )
    assert info.value.field == "kv.layers[1]"
    with pytest.raises(InvalidArgumentError) as info:
        check_kv(layout, PagedKV.of_blocks(good, [0, 6]), 1)
    assert info.value.field == "kv.block_ids"


def test_a_paged_layer_whose_blocks_are_not_contiguous_is_refused() -> None:
    layout = KVLayout(1, 2, 8, KVDtype.FLOAT32, chunk_tokens=16, page_tokens=16)
    strided = torch.zeros(2, 4, 2, 16, 8).transpose(2, 3)  # [2, N, B, H, D] with B and H swapped in memory
    with pytest.raises(InvalidArgumentError, match="not contiguous") as info:
        check_kv(layout, PagedKV([strided], [0]), 1)
    assert info.value.field == "kv.layers[0]"

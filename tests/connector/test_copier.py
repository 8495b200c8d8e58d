"""The load-side copier: chunks scattered into the engine's KV on its own thread, buffers in rotation."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tiercache.connector.copier import ChunkCopier, PieceCopier, staged_chunks
from tiercache.connector.kv import ContiguousKV, chunk_parts, kv_to_chunk
from tiercache.connector.results import StreamChunk
from tiercache.connector.stream import StreamPiece
from tiercache.layout import KVDtype, KVLayout

LAYOUT = KVLayout(2, 2, 8, KVDtype.BFLOAT16, 32, 16)
CHUNKS = 5


def _kv(seed: int | None) -> ContiguousKV:
    shape = (2, CHUNKS * LAYOUT.chunk_tokens, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    if seed is None:
        return ContiguousKV([torch.zeros(shape, dtype=torch.bfloat16) for _ in range(LAYOUT.num_layers)])
    gen = torch.Generator().manual_seed(seed)
    return ContiguousKV(
        [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(LAYOUT.num_layers)]
    )


def test_every_chunk_lands_in_the_kv_through_two_rotating_buffers() -> None:
    src, dst = _kv(1), _kv(None)
    threads = torch.get_num_threads()
    seen: set[int] = set()
    with ChunkCopier(LAYOUT, dst, depth=2) as copier:
        for index in range(CHUNKS):
            buf = copier.buffer()
            seen.add(id(buf))
            kv_to_chunk(LAYOUT, src, index, torch.frombuffer(buf, dtype=torch.uint8))
            copier.submit(StreamChunk(index, b"k", buf))
    assert len(seen) == 2  # a buffer is reused only once the copy that read it is done
    assert all(torch.equal(a, b) for a, b in zip(src.layers, dst.layers))
    assert torch.get_num_threads() == threads  # the caller's intra-op threads are left alone


def test_a_failed_copy_is_raised_and_the_thread_stops() -> None:
    copier = ChunkCopier(LAYOUT, _kv(None), depth=1)
    with pytest.raises(RuntimeError, match="size of tensor"), copier:
        buf = copier.buffer()
        copier.submit(StreamChunk(CHUNKS + 3, b"k", buf))  # past the end of the KV
        copier.buffer()  # waits for that copy: its failure surfaces here
    with pytest.raises(RuntimeError, match="shutdown"):
        copier.submit(StreamChunk(0, b"k", bytearray(LAYOUT.chunk_bytes)))


def test_staged_chunks_are_the_kv_chunks_in_order_through_two_buffers() -> None:
    src = _kv(2)
    positions = [3, 0, 4, 1]
    expected = []
    for p in positions:
        buf = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(LAYOUT, src, p, buf)
        expected.append(bytes(buf.numpy()))
    got, buffers = [], set()
    for staged in staged_chunks(LAYOUT, src, positions):
        got.append(bytes(staged.numpy()))  # used before the next is asked for
        buffers.add(staged.data_ptr())
    assert got == expected and len(buffers) == 2
    assert list(staged_chunks(LAYOUT, src, [])) == []


def test_a_failed_gather_is_raised_when_its_chunk_is_due() -> None:
    chunks = staged_chunks(LAYOUT, _kv(2), [0, CHUNKS + 3])
    next(chunks)
    with pytest.raises(RuntimeError, match="size of tensor"):
        next(chunks)


def test_lent_read_only_chunks_land_in_the_kv_and_take_no_buffer() -> None:
    src, dst = _kv(4), _kv(None)
    with ChunkCopier(LAYOUT, dst, depth=2) as copier:
        for index in range(CHUNKS):
            buf = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
            kv_to_chunk(LAYOUT, src, index, buf)
            received = bytes(buf.numpy())  # as a received message: immutable
            copier.submit(StreamChunk(index, b"k", memoryview(received).toreadonly()))
        assert isinstance(copier.buffer(), bytearray)  # a lent message is never handed out for assembly
    assert all(torch.equal(a, b) for a, b in zip(src.layers, dst.layers))


def _pieces(src: ContiguousKV, size: int) -> list[StreamPiece]:
    """Every chunk of ``src`` as received pieces of ``size`` bytes (immutable, like received messages)."""
    pieces = []
    for index in range(CHUNKS):
        buf = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        kv_to_chunk(LAYOUT, src, index, buf)
        whole = bytes(buf.numpy())
        for start in range(0, LAYOUT.chunk_bytes, size):
            stop = min(start + size, LAYOUT.chunk_bytes)
            data = memoryview(whole)[start:stop]
            pieces.append(StreamPiece(index, b"k", start, data, True, stop == LAYOUT.chunk_bytes))
    return pieces


@pytest.mark.parametrize("size", [LAYOUT.chunk_bytes, 1000, 777])  # whole chunks, pieces across K/V parts
def test_pieces_land_straight_in_their_place_in_the_kv(size: int) -> None:
    src, dst = _kv(5), _kv(None)
    parts = chunk_parts(LAYOUT, dst)
    assert parts is not None
    with PieceCopier(parts, LAYOUT.chunk_bytes, depth=2) as copier:
        for piece in _pieces(src, size):
            copier.submit(piece)
    assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(src.layers, dst.layers))


def test_a_piece_of_a_chunk_the_kv_does_not_hold_is_refused_before_any_copy() -> None:
    short = ContiguousKV([t[:, : 2 * LAYOUT.chunk_tokens].clone() for t in _kv(None).layers])
    parts = chunk_parts(LAYOUT, short)
    assert parts is not None
    pieces = _pieces(_kv(6), 1000)
    with PieceCopier(parts, LAYOUT.chunk_bytes) as copier:
        copier.submit(pieces[0])
        with pytest.raises(ValueError, match="chunk 2: the KV holds 0 of"):
            copier.submit(next(p for p in pieces if p.index == 2))
    assert all(int(t[:, 2 * LAYOUT.chunk_tokens :].abs().sum()) == 0 for t in short.layers)


_LENT_TWICE = """
import torch
from tiercache.connector.copier import ChunkCopier
from tiercache.connector.kv import ContiguousKV
from tiercache.connector.results import StreamChunk
from tiercache.layout import KVDtype, KVLayout

layout = KVLayout(2, 2, 8, KVDtype.BFLOAT16, 32, 16)
kv = ContiguousKV([torch.zeros(2, 64, 2, 8, dtype=torch.bfloat16) for _ in range(2)])
with ChunkCopier(layout, kv) as copier:
    for index in range(2):
        copier.submit(StreamChunk(index, b"k", memoryview(bytes([index + 1]) * layout.chunk_bytes).toreadonly()))
assert all(int(t.view(torch.uint8)[:, 32 * index : 32 * (index + 1)].min()) == index + 1
           for t in kv.layers for index in range(2))
"""


def test_lent_chunks_raise_no_warning_that_torch_could_write_them() -> None:
    # torch warns about a read-only buffer once per process: a fresh process shows whether it escapes
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _LENT_TWICE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr

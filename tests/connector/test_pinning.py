"""Engine-side pinning: the daemon's mapped segment is page-locked in the engine when CUDA is present, and
host-to-device loads out of it are queued asynchronously, then fenced before the lease is released."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tiercache import pinning
from tiercache.connector import ClientConfig, ContiguousKV, KVConnector, TierCacheClient
from tiercache.connector.results import SegmentInfo, SlotRef
from tiercache.connector.segments import SegmentMaps, SlotMapping
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.shm import SharedSegment

Daemon = Any  # tests/connector/conftest.py:Daemon

LAYOUT = KVLayout(4, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16)
TOKENS = 4 * 16


@pytest.fixture
def segment() -> Iterator[SharedSegment]:
    seg = SharedSegment.create(f"tiercache-pin-{secrets.token_hex(3)}", 4 * 4096)
    yield seg
    seg.close()
    seg.unlink()


def _info(seg: SharedSegment, **kw: Any) -> SegmentInfo:
    return SegmentInfo(seg.name, 4096, 4, 4 * 4096, **kw)


def _kv(seed: int | None, device: str = "cpu") -> ContiguousKV:
    shape = (2, TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    if seed is None:
        return ContiguousKV([torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(4)])
    gen = torch.Generator().manual_seed(seed)
    return ContiguousKV([torch.randn(shape, generator=gen).to(torch.bfloat16).to(device) for _ in range(4)])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().view(torch.int16), b.cpu().view(torch.int16))


def test_pin_refuses_what_cannot_be_registered_naming_it() -> None:
    strided = torch.zeros((4, 8), dtype=torch.uint8)[:, ::2]
    with pytest.raises(ValueError, match=r"contiguous CPU tensor.*weird-buffer"):
        pinning.pin(strided, "weird-buffer")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_cuda_a_mapping_is_not_pinned_and_still_serves(segment: SharedSegment) -> None:
    assert pinning.pin(torch.zeros(16, dtype=torch.uint8), "plain") is False
    mapping = SlotMapping.attach(_info(segment))
    assert mapping.pinned is False
    segment.buffer[4096:4100] = b"\x01\x02\x03\x04"
    with mapping.use() as slots:
        assert slots.view(SlotRef(0, 1, 4)).tolist() == [1, 2, 3, 4]
    mapping.retire()
    assert mapping.pinned is False


@pytest.mark.gpu
def test_a_named_segment_is_pinned_while_mapped_unless_asked_not_to(segment: SharedSegment) -> None:
    mapping = SlotMapping.attach(_info(segment))
    assert mapping.pinned
    with mapping.use() as slots:
        assert slots.view(SlotRef(0, 0, 4096)).is_pinned()
    mapping.retire()
    assert not mapping.pinned  # unregistered before it was unmapped
    unpinned = SlotMapping.attach(_info(segment), pin=False)
    assert not unpinned.pinned
    unpinned.retire()
    maps = SegmentMaps(pin=False)
    off = maps.mapping(_info(segment))
    assert off is not None and not off.pinned
    maps.close()


@pytest.mark.gpu
def test_loads_into_cuda_from_the_pinned_segment_are_bit_exact(shared_daemon: Daemon) -> None:
    client = TierCacheClient.connect(shared_daemon.address, config=ClientConfig(timeout_s=10.0))
    ns = Namespace(model_id="test/pinning", revision="r1", layout=LAYOUT, tokenizer_id="tok", cache_salt="p")
    conn = KVConnector(client, ns)
    try:
        mapping = client.slot_mapping(ns)
        assert mapping is not None and mapping.pinned
        prompt = [7000 + t for t in range(TOKENS)]
        source = _kv(seed=11)
        assert conn.store(prompt, source).tokens_stored == TOKENS
        for _ in range(3):  # repeated: a fence missing before the release would let a later store race it
            kv = _kv(None, device="cuda")
            assert conn.load(prompt, kv).tokens_loaded == TOKENS
            assert all(_same(a, b) for a, b in zip(kv.layers, source.layers, strict=True))
        device_source = _kv(seed=12, device="cuda")
        other = [8000 + t for t in range(TOKENS)]
        assert conn.store(other, device_source).tokens_stored == TOKENS
        back = _kv(None)
        assert conn.load(other, back).tokens_loaded == TOKENS
        assert all(_same(a, b) for a, b in zip(back.layers, device_source.layers, strict=True))
    finally:
        client.close()


@pytest.mark.gpu
def test_a_refused_registration_leaves_no_cuda_error_behind(segment: SharedSegment) -> None:
    memory = torch.frombuffer(segment.buffer, dtype=torch.uint8)
    assert pinning.pin(memory, "first")
    try:
        assert pinning.pin(memory, "again") is False  # the driver refuses: already registered (error 712)
        out = torch.arange(1024, device="cuda") * 2  # a launch: its check would raise a left-over error
        torch.cuda.synchronize()
        assert int(out[-1]) == 2046
    finally:
        pinning.unpin(memory, "first")
    del memory

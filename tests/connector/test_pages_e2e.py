"""A daemon with pages (``--page-bytes`` under ``--slot-bytes``): engines find multi-page chunks from the
first page the SlotRef names, two chunk sizes share L2 with little waste, and Stats and ``/metrics`` say how
much of L2 the chunks fill."""

from __future__ import annotations

import secrets
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tiercache.connector import (
    ClientConfig,
    ConnectorConfig,
    ContiguousKV,
    KVConnector,
    TierCacheClient,
    TierLevel,
)
from tiercache.connector.results import SegmentInfo, SlotRef
from tiercache.connector.segments import SlotMapping
from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.shm import SharedSegment
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon
WAIT_S = 30.0
PAGE = 4096


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _namespace(layout: KVLayout) -> Namespace:
    return Namespace(
        model_id=f"test/pages-{layout.head_dim}", revision="r1", layout=layout, tokenizer_id="tok"
    )


SMALL = KVLayout(2, 2, 24, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16)  # 6 KiB: 1.5 pages
LARGE = KVLayout(4, 2, 40, KVDtype.BFLOAT16, chunk_tokens=32, page_tokens=16)  # 40 KiB: 10 pages


def _kv(layout: KVLayout, n_tokens: int, seed: int | None) -> ContiguousKV:
    shape = (2, n_tokens, layout.num_kv_heads, layout.head_dim)
    gen = torch.Generator().manual_seed(seed or 0)
    layers = [
        torch.randn(shape, generator=gen).to(torch.bfloat16)
        if seed is not None
        else torch.zeros(shape, dtype=torch.bfloat16)
        for _ in range(layout.num_layers)
    ]
    return ContiguousKV(layers)


def test_chunks_of_two_sizes_round_trip_through_pages(daemon_factory: Callable[..., Daemon]) -> None:
    port = _free_port()
    daemon = daemon_factory(
        "--page-bytes", "4K", "--l1-device", "none", "--metrics-port", str(port), "--metrics-public"
    )
    daemon.start()
    client = TierCacheClient.connect(daemon.address, config=ClientConfig(timeout_s=10.0))
    try:
        conns = {
            layout: KVConnector(client, _namespace(layout), ConnectorConfig()) for layout in (SMALL, LARGE)
        }
        chunks = {SMALL: 0, LARGE: 0}
        for i, (layout, n_tokens) in enumerate(
            [(SMALL, 16 * 9), (LARGE, 32 * 5), (SMALL, 16 * 4), (LARGE, 32 * 3)]
        ):
            prompt = [(i * 7919 + t * 104_729) % 50_000 for t in range(n_tokens)]
            conn = conns[layout]
            assert conn.store(prompt, _kv(layout, n_tokens, i)).tokens_stored == n_tokens
            chunks[layout] += n_tokens // layout.chunk_tokens
            loaded = _kv(layout, n_tokens, None)
            res = conn.load(prompt, loaded)
            assert res.tokens_loaded == n_tokens and not res.remote
            want = _kv(layout, n_tokens, i)
            for got, src in zip(loaded.layers, want.layers):  # bit for bit
                assert torch.equal(got.view(torch.int16), src.view(torch.int16))
        segment = client.registration(conns[LARGE].namespace).segment
        assert segment is not None and segment.slot_bytes == PAGE and segment.max_chunk_bytes == 64 * 1024
        assert segment.num_slots == (16 << 20) // PAGE
        payload = chunks[SMALL] * SMALL.chunk_bytes + chunks[LARGE] * LARGE.chunk_bytes
        wait_until(
            lambda: client.stats().tier(TierLevel.L2).chunks == sum(chunks.values()),
            WAIT_S,
            "L2 to hold the chunks",
        )
        l2 = client.stats().tier(TierLevel.L2)
        assert l2.payload_bytes == payload
        assert l2.used_bytes == chunks[SMALL] * 2 * PAGE + chunks[LARGE] * 10 * PAGE
        assert l2.utilisation == pytest.approx(payload / l2.capacity_bytes)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert f'tiercache_tier_payload_bytes{{tier="L2"}} {float(payload)!r}' in text
        assert 'tiercache_tier_utilisation{tier="L2"}' in text
    finally:
        client.close()


@pytest.fixture
def segment() -> Any:
    seg = SharedSegment.create(f"tiercache-cpages-{secrets.token_hex(3)}", 8 * PAGE)
    yield seg
    seg.close()
    seg.unlink()


def test_a_view_spans_the_pages_after_the_first(segment: SharedSegment) -> None:
    info = SegmentInfo(segment.name, PAGE, 8, 8 * PAGE, max_chunk_bytes=3 * PAGE)
    mapping = SlotMapping.attach(info)
    with mapping.use() as slots:
        view = slots.view(SlotRef(index=0, slot=5, nbytes=3 * PAGE))
        view.fill_(9)
        assert bytes(segment.buffer[5 * PAGE : 8 * PAGE]) == b"\x09" * (3 * PAGE)
        with pytest.raises(TierCacheError, match="outside the segment"):
            slots.view(SlotRef(0, 6, 3 * PAGE))  # past the end of the segment
        with pytest.raises(TierCacheError, match="outside the segment"):
            slots.view(SlotRef(0, 0, 3 * PAGE + 1))  # longer than the daemon's largest chunk
    mapping.retire()
    old = SlotMapping.attach(SegmentInfo(segment.name, PAGE, 8, 8 * PAGE))  # a daemon without pages
    with old.use() as slots, pytest.raises(TierCacheError, match="outside the segment"):
        slots.view(SlotRef(0, 0, PAGE + 1))
    old.retire()

"""Layerwise loads and saves through a real daemon: layer order and completeness at ``wait_layer``, failure
without a leaked lease, invisibility of a save before its commit, and a CUDA stream/event variant (gpu)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import tiercache.connector.layerwise as layerwise
from tiercache.connector import (
    ClientConfig,
    ConnectorConfig,
    ContiguousKV,
    DataPlaneMode,
    KVConnector,
    LoadPolicy,
    TierCacheClient,
    TierLevel,
)
from tiercache.errors import ConflictError
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.waits import wait_until

Daemon = Any  # tests/connector/conftest.py:Daemon

LAYOUT = KVLayout(4, 2, 16, KVDtype.BFLOAT16, chunk_tokens=16, page_tokens=16)
"""4 layers x 2 kv heads x 16 dims x 16 tokens, bf16: 8 KiB per chunk."""
TOKENS = 3 * 16
WAIT_S = 30.0


def _namespace(salt: str) -> Namespace:
    return Namespace(
        model_id="test/layerwise", revision="r1", layout=LAYOUT, tokenizer_id="tok", cache_salt=salt
    )


def _connector(address: str, salt: str) -> KVConnector:
    client = TierCacheClient.connect(address, config=ClientConfig(timeout_s=10.0))
    return KVConnector(client, _namespace(salt))


def _prompt(seed: int) -> list[int]:
    return [seed * 1000 + t for t in range(TOKENS)]


def _kv(seed: int | None, device: str = "cpu") -> ContiguousKV:
    shape = (2, TOKENS, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    if seed is None:
        return ContiguousKV([torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(4)])
    gen = torch.Generator().manual_seed(seed)
    return ContiguousKV([torch.randn(shape, generator=gen).to(torch.bfloat16).to(device) for _ in range(4)])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().view(torch.int16), b.cpu().view(torch.int16))


class Gate:
    """Replaces the layerwise copier's ``chunks_to_kv`` (its host path: one layer of every chunk): records
    (layer, chunk) and holds each layer until the test opens it (optionally failing one layer)."""

    def __init__(self, real: Callable[..., None], fail_layer: int | None = None) -> None:
        self.real = real
        self.fail_layer = fail_layer
        self.order: list[tuple[int, int]] = []
        self.open = [threading.Event() for _ in range(LAYOUT.num_layers)]

    def __call__(
        self, layout: KVLayout, chunks: Sequence[tuple[int, torch.Tensor]], kv: ContiguousKV, layer: int
    ) -> None:
        assert self.open[layer].wait(WAIT_S), f"layer {layer} never opened"
        if layer == self.fail_layer:
            raise RuntimeError("injected copy failure")
        self.order.extend((layer, chunk) for chunk, _ in chunks)
        self.real(layout, chunks, kv, layer)


def test_wait_layer_returns_each_layer_complete_and_in_order(
    shared_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = _connector(shared_daemon.address, "order")
    source = _kv(seed=1)
    assert conn.store(_prompt(1), source).tokens_stored == TOKENS
    gate = Gate(layerwise.chunks_to_kv)
    monkeypatch.setattr(layerwise, "chunks_to_kv", gate)
    kv = _kv(None)
    with conn.load_layerwise(_prompt(1), kv, LoadPolicy.best_effort()) as load:
        assert load.tokens_loaded == TOKENS
        for layer in range(LAYOUT.num_layers):
            assert load.layers_done == layer
            assert not kv.layers[layer].any(), "a layer arrived before its turn"
            gate.open[layer].set()
            assert load.wait_layer(layer) == TOKENS
            assert _same(kv.layers[layer], source.layers[layer]), f"layer {layer} incomplete at wait_layer"
            if layer + 1 < LAYOUT.num_layers:
                assert not kv.layers[layer + 1].any()
        result = load.result(timeout_s=WAIT_S)
    assert gate.order == [(layer, chunk) for layer in range(4) for chunk in range(3)]
    assert result.tokens_loaded == TOKENS and dict(result.sources) == {TierLevel.L2: TOKENS}
    wait_until(lambda: conn.client.stats().active_leases == 0, WAIT_S, "the lease to be released")


def test_a_failed_layer_copy_reports_zero_and_releases_the_lease(
    shared_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = _connector(shared_daemon.address, "fail")
    assert conn.store(_prompt(2), _kv(seed=2)).tokens_stored == TOKENS
    gate = Gate(layerwise.chunks_to_kv, fail_layer=2)
    for event in gate.open:
        event.set()
    monkeypatch.setattr(layerwise, "chunks_to_kv", gate)
    load = conn.load_layerwise(_prompt(2), _kv(None))
    assert load.result(timeout_s=WAIT_S).tokens_loaded == 0
    assert load.wait_layer(3) == 0 and load.tokens_loaded == 0
    load.close()
    wait_until(lambda: conn.client.stats().active_leases == 0, WAIT_S, "the lease to be released")


def test_a_miss_and_a_dead_daemon_give_zero_tokens(shared_daemon: Daemon, tmp_path: Any) -> None:
    conn = _connector(shared_daemon.address, "miss")
    with conn.load_layerwise(_prompt(3), _kv(None)) as load:
        assert load.wait_layer(0) == 0 and load.result().tokens_loaded == 0
    dead = _connector(f"unix:{tmp_path / 'nobody.sock'}", "dead")
    with dead.load_layerwise(_prompt(3), _kv(None)) as load:
        assert load.wait_layer(LAYOUT.num_layers - 1) == 0
    with dead.begin_save(_prompt(3)) as save:
        for layer in range(LAYOUT.num_layers):
            save.save_layer(layer, _kv(seed=3))
        assert save.commit().tokens_stored == 0


def test_a_layerwise_save_is_invisible_until_commit_and_an_abort_leaves_nothing(
    shared_daemon: Daemon,
) -> None:
    writer, reader = _connector(shared_daemon.address, "save"), _connector(shared_daemon.address, "save")
    source = _kv(seed=4)
    with writer.begin_save(_prompt(4)) as save:
        for layer in range(LAYOUT.num_layers):
            save.save_layer(layer, source)
            assert reader.lookup(_prompt(4)) == 0, f"visible after layer {layer}"
            if layer < LAYOUT.num_layers - 1:
                with pytest.raises(ConflictError):
                    save.commit()
        assert save.commit().tokens_stored == TOKENS
    assert reader.lookup(_prompt(4)) == TOKENS
    kv = _kv(None)
    assert reader.load(_prompt(4), kv).tokens_loaded == TOKENS
    assert all(_same(a, b) for a, b in zip(kv.layers, source.layers))

    with pytest.raises(RuntimeError, match="engine died"), writer.begin_save(_prompt(5)) as save:
        save.save_layer(0, _kv(seed=5))
        raise RuntimeError("engine died")
    assert reader.lookup(_prompt(5)) == 0
    # The aborted reservation is gone: the chunks can be stored again at once.
    assert writer.store(_prompt(5), _kv(seed=5)).tokens_stored == TOKENS


@pytest.mark.gpu
def test_layerwise_load_into_cuda_tensors_uses_a_stream_and_events(shared_daemon: Daemon) -> None:
    conn = _connector(shared_daemon.address, "cuda")
    source = _kv(seed=6)
    assert conn.store(_prompt(6), source).tokens_stored == TOKENS
    kv = _kv(None, device="cuda")
    sums = []
    with conn.load_layerwise(_prompt(6), kv) as load:
        for layer in range(LAYOUT.num_layers):
            assert load.wait_layer(layer) == TOKENS
            sums.append(kv.layers[layer].float().sum())  # ordered after the layer's event on this stream
        assert load.result(timeout_s=WAIT_S).tokens_loaded == TOKENS
    for layer in range(LAYOUT.num_layers):
        assert torch.isclose(sums[layer].cpu(), source.layers[layer].float().sum(), rtol=1e-3)
        assert _same(kv.layers[layer], source.layers[layer])
    save_kv = _kv(seed=7, device="cuda")
    with conn.begin_save(_prompt(7)) as save:
        for layer in range(LAYOUT.num_layers):
            save.save_layer(layer, save_kv)
        assert save.commit().tokens_stored == TOKENS
    back = _kv(None)
    assert conn.load(_prompt(7), back).tokens_loaded == TOKENS
    assert all(_same(a, b) for a, b in zip(back.layers, save_kv.layers))


@pytest.mark.parametrize("force_remote", [False, True], ids=["shm", "stream"])
def test_a_save_filled_chunk_by_chunk_after_a_known_cached_prefix(
    shared_daemon: Daemon, force_remote: bool
) -> None:
    """``begin_save(keys, cached=1)`` reserves chunks 1.. only (nothing looked up); ``save_chunks`` fills
    them over two calls, the commit is refused until every reserved chunk was saved, then publishes them."""
    salt = f"chunkwise-{int(force_remote)}"
    conn = KVConnector(
        TierCacheClient.connect(shared_daemon.address, config=ClientConfig(timeout_s=10.0)),
        _namespace(salt),
        ConnectorConfig(DataPlaneMode.STREAM if force_remote else DataPlaneMode.AUTO),
    )
    source, prompt = _kv(seed=6), _prompt(6)
    assert conn.store(prompt[:16], source).tokens_stored == 16  # chunk 0 cached
    keys = chunk_keys(_namespace(salt), prompt)
    with conn.data_plane().begin_save(keys, cached=1) as save:
        save.save_chunks(source, [0, 1])  # chunk 0 is not reserved: skipped
        with pytest.raises(ConflictError, match=r"chunks \[2\]"):
            save.commit()
        assert conn.lookup(prompt) == 16
        save.save_chunks(source, [2])
        result = save.commit()
    assert (result.tokens_stored, result.tokens_skipped) == (2 * 16, 16)
    kv = _kv(None)
    assert conn.load(prompt, kv).tokens_loaded == TOKENS
    assert all(_same(a, b) for a, b in zip(kv.layers, source.layers))

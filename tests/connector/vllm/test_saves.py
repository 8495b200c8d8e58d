"""The worker's saves on a real daemon, without an engine: a chunk the daemon already holds is never sent.

The scheduler learns at lookup which prefix is cached; another engine may store more of the same prompt
before this request's save reaches the daemon. Over shared memory BeginStore then answers those chunks as
``skipped`` (no slot: nothing is copied) and the commit publishes the rest; over the byte stream the commit
looks them up first and sends only the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.connector import ConnectorConfig, TierCacheClient
from tiercache.connector.kv import PagedKV, kv_to_chunk
from tiercache.connector.stream_plane import ByteStreamPlane
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout, block_planes
from tiercache.connector.vllm.metadata import SaveSpec, TierCacheMetadata
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import DaemonProcess as Daemon

LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)  # 64 KiB: one daemon slot


def _caches(blocks: int, seed: int) -> dict[str, torch.Tensor]:
    shape = BackendLayout.CPU.expected_shape(blocks, LAYOUT)
    gen = torch.Generator().manual_seed(seed)
    return {f"layers.{i}": torch.randn(shape, generator=gen) for i in range(LAYOUT.num_layers)}


def _recording(calls: list[Any], call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, recording each call's arguments and answer in ``calls`` (the call itself is the real one)."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        answer = call(*args, **kwargs)
        calls.append((args, kwargs, answer))
        return answer

    return recorded


@pytest.mark.parametrize("data_plane", ["shm", "stream"])
def test_a_chunk_another_engine_stored_after_the_lookup_is_not_sent(daemon: Daemon, data_plane: str) -> None:
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    ns = identity.namespace()
    tokens = tuple(range(7000, 7000 + 3 * 32))
    keys = chunk_keys(ns, tokens)
    theirs = torch.full((LAYOUT.chunk_bytes,), 7, dtype=torch.uint8)
    config = VllmConnectorConfig.from_extra_config(
        {"address": daemon.address, "chunk_tokens": 32, "data_plane": data_plane}, block_size=32
    )
    src = _caches(4, seed=9)
    with TierCacheClient.connect(daemon.address) as client, TierCacheClient.connect(daemon.address) as other:
        worker = WorkerSide(identity, client, config)
        worker.register_kv_caches(src)
        # The scheduler looked the prompt up and found nothing; then another engine stored chunks 0 and 1.
        grant = other.begin_store(ns, keys[:2])
        mapping = other.slot_mapping(ns)
        assert mapping is not None
        with mapping.use() as slots:
            for ref in grant.slots:
                slots.view(ref).copy_(theirs)
        assert other.commit_store(ns, grant.ticket_id) == 2

        begun: list[Any] = []
        sent: list[Any] = []
        client.begin_store = _recording(begun, client.begin_store)  # type: ignore[method-assign]
        plane = worker.plane(ns)
        if isinstance(plane, ByteStreamPlane):
            plane.send = _recording(sent, plane.send)  # type: ignore[method-assign]
        first = SaveSpec("r", "", "", tokens, 0, (0, 1), (2, 0), commit=False)
        worker.wait_for_save(TierCacheMetadata(saves=[first]))
        worker.wait_for_save(TierCacheMetadata(saves=[SaveSpec("r", "", "", (), 0, (2,), (2, 0, 3), True)]))
        worker.shutdown()  # waits for the save thread
        assert worker.save_failures == 0

        if data_plane == "shm":  # chunks 0 and 1 got no slot (nothing to copy them into); 2 did
            [(_, _, answer)] = begun
            assert sorted(answer.skipped) == [0, 1] and [r.index for r in answer.slots] == [2]
        else:  # only chunk 2 went over the stream
            [((sent_keys, _), kwargs, result)] = sent
            assert list(sent_keys) == [keys[2]] and kwargs["start_depth"] == 2 and result.stored == 1
        assert client.lookup(ns, keys).chunks == 3  # the commit worked
        got: list[bytes] = []
        reader = ByteStreamPlane(client, ns, ConnectorConfig())
        assert reader.receive(keys, lambda c: got.append(bytes(c.data))) == 3
        assert got[0] == got[1] == bytes(theirs.numpy())  # theirs, untouched
        want = torch.empty(LAYOUT.chunk_bytes, dtype=torch.uint8)
        planes = [block_planes(BackendLayout.CPU, t) for t in src.values()]
        kv_to_chunk(LAYOUT, PagedKV.of_blocks(planes, (2, 0, 3)), 2, want)
        assert got[2] == bytes(want.numpy())  # ours, bit-exact

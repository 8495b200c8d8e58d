"""The worker's parts on a real daemon, without an engine: the layer loader, connecting ahead, the save thread."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.connector import TierCacheClient
from tiercache.connector.channel import parse_address
from tiercache.connector.vllm.ahead import connect_ahead
from tiercache.connector.vllm.layout import BackendLayout, block_planes, chunk_planes
from tiercache.connector.vllm.loads import LayerLoader, LeasedLoad
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.saves import SAVE_NICE, SaveQueue
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import DaemonProcess as Daemon

LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)  # 64 KiB: one daemon slot
NS = Namespace(model_id="tiny", revision="+kv:cpu", layout=LAYOUT)


def _active_leases(daemon: Daemon) -> int:
    with TierCacheClient.connect(daemon.address) as other:  # another client: this one's queue stays queued
        return other.stats().active_leases


def test_loader_copies_and_defers_the_release_of_a_lease_in_time(daemon: Daemon) -> None:
    keys = chunk_keys(NS, list(range(32)))
    chunk = torch.randint(
        0, 256, (LAYOUT.chunk_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    with TierCacheClient(parse_address(daemon.address), settle_after_s=600.0) as client:
        grant = client.begin_store(NS, keys)
        mapping = client.slot_mapping(NS)
        assert mapping is not None
        with mapping.use() as slots:
            slots.view(grant.slots[0]).copy_(chunk)
        assert client.commit_store(NS, grant.ticket_id) == 1
        lease = client.acquire_load(NS, keys)
        caches = [
            block_planes(BackendLayout.CPU, torch.zeros(BackendLayout.CPU.expected_shape(4, LAYOUT)))
            for _ in range(LAYOUT.num_layers)
        ]
        load = LeasedLoad(NS, lease, lease.slots, mapping, (2,), 0, started=0.0)
        loader = LayerLoader(client, BackendLayout.CPU, LAYOUT, caches, [load], clock=lambda: 0.0)
        # Into a CPU cache the copy is made by the caller, before the forward pass: no thread, already there.
        assert not any(t.name == "tiercache-vllm-load" for t in threading.enumerate())
        assert torch.equal(caches[-1][:, 2], chunk_planes(BackendLayout.CPU, LAYOUT, chunk, 1)[:, 0])
        loader.wait(LAYOUT.num_layers - 1)
        assert loader.finish() == set()
        for layer, cache in enumerate(caches):
            assert torch.equal(cache[:, 2], chunk_planes(BackendLayout.CPU, LAYOUT, chunk, layer)[:, 0])
            assert not cache[:, [0, 1, 3]].any()
        assert _active_leases(daemon) == 1  # the clock proved the lease held: its release waits for a call
        client.settle()
        assert _active_leases(daemon) == 0


def test_connect_ahead_registers_and_maps_before_the_first_request(daemon: Daemon) -> None:
    with TierCacheClient.connect(daemon.address) as client:
        connect_ahead(client, NS, map_segment=True).join()
        assert daemon.proc is not None
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(30)
        mapping = client.slot_mapping(NS)  # no call left to make: registered and mapped at start
        assert mapping is not None and mapping.info.num_slots > 0


def test_connect_ahead_without_a_daemon_logs(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="tiercache.connector.vllm.ahead")
    with TierCacheClient.connect(f"unix:{tmp_path / 'nobody.sock'}", timeout_s=1.0) as client:
        connect_ahead(client, NS, map_segment=False).join()
    assert any("not reachable" in r.getMessage() for r in caplog.records)


def test_save_thread_runs_at_a_lower_priority() -> None:
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    seen: list[int] = []
    with TierCacheClient.connect("unix:/nonexistent/tiercache.sock") as client:
        queue = SaveQueue(client, identity, lambda: [])
        queue._post("r", lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        queue.close()
    assert seen == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + SAVE_NICE)]

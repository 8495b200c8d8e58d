"""The worker's parts on a real daemon, without an engine: the layer loader, connecting ahead, the save thread,
loads and saves over the byte stream."""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.connector import ConnectorConfig, TierCacheClient
from tiercache.connector.channel import parse_address
from tiercache.connector.paged import chunk_layer_planes
from tiercache.connector.results import SlotRef
from tiercache.connector.segments import PREFAULT_MAX_BYTES
from tiercache.connector.stream_plane import ByteStreamPlane
from tiercache.connector.vllm.ahead import connect_ahead
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout, block_planes
from tiercache.connector.vllm.loads import LeasedLoad
from tiercache.connector.vllm.metadata import LoadSpec, SaveSpec, TierCacheMetadata
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.saves import SaveQueue
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.shm import SHM_DIR
from tiercache.testing.daemon import DaemonProcess as Daemon
from tiercache.testing.memory import resident_bytes

LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)  # 64 KiB: one daemon slot
NS = Namespace(model_id="tiny", revision="+kv:cpu", layout=LAYOUT)


def _active_leases(daemon: Daemon) -> int:
    with TierCacheClient.connect(daemon.address) as other:  # another client: this one's queue stays queued
        return other.stats().active_leases


def test_a_leased_load_copies_and_defers_the_release_of_a_lease_in_time(daemon: Daemon) -> None:
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
        leased = LeasedLoad(NS, lease, lease.slots, mapping, (2,), 0, started=0.0)
        load = leased.start(client, LAYOUT, caches, clock=lambda: 0.0)
        # Into a CPU cache the copy is made by the caller, before the forward pass: no thread, already there.
        assert not any(t.name == "tiercache-layerwise-load" for t in threading.enumerate())
        assert torch.equal(caches[-1][:, 2], chunk_layer_planes(LAYOUT, chunk, 1, 1)[:, 0])
        load.wait_layer(LAYOUT.num_layers - 1)
        assert load.result().tokens_loaded == 32
        for layer, cache in enumerate(caches):
            assert torch.equal(cache[:, 2], chunk_layer_planes(LAYOUT, chunk, layer, 1)[:, 0])
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


def test_connect_ahead_maps_the_segments_pages_in(daemon: Daemon) -> None:
    with TierCacheClient.connect(daemon.address) as client:
        connect_ahead(client, NS, map_segment=True).join()
        mapping = client.slot_mapping(NS)
        assert mapping is not None
        prefault = [t for t in threading.enumerate() if t.name == "tiercache-prefault"]
        for thread in prefault:  # it may have finished already
            thread.join(60)
        with mapping.use() as slots:
            address = slots.view(SlotRef(0, 0, 1)).data_ptr()
        assert resident_bytes(address) == min(mapping.info.segment_bytes, PREFAULT_MAX_BYTES)


def test_connect_ahead_without_a_daemon_logs(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="tiercache.connector.vllm.ahead")
    with TierCacheClient.connect(f"unix:{tmp_path / 'nobody.sock'}", timeout_s=1.0) as client:
        connect_ahead(client, NS, map_segment=False).join()
    assert any("not reachable" in r.getMessage() for r in caplog.records)


def test_save_thread_runs_at_the_engines_priority() -> None:
    # No nice of its own: at +10 it may hold the GIL while descheduled (not separated in the serve bench).
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    seen: list[int] = []
    with TierCacheClient.connect("unix:/nonexistent/tiercache.sock") as client:
        queue = SaveQueue(
            client, identity, lambda: [], lambda ns: ByteStreamPlane(client, ns, ConnectorConfig())
        )
        queue._post("r", lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        queue.close()
    assert seen == [os.getpriority(os.PRIO_PROCESS, 0)]


def test_one_save_thread_serves_requests_that_follow_each_other(monkeypatch: pytest.MonkeyPatch) -> None:
    # Starting a thread per request made the engine's thread wait for the new one to be scheduled.
    monkeypatch.setattr("tiercache.connector.vllm.saves.SAVE_IDLE_S", 3600.0)  # only a post can wake it
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    seen: list[int] = []
    done = threading.Event()
    with TierCacheClient.connect("unix:/nonexistent/tiercache.sock") as client:
        queue = SaveQueue(
            client, identity, lambda: [], lambda ns: ByteStreamPlane(client, ns, ConnectorConfig())
        )
        queue._post("a", lambda: (seen.append(threading.get_ident()), done.set()))
        assert done.wait(30)
        with queue._cond:  # the job ran: the thread now waits for more work
            queue._cond.wait_for(lambda: not queue._pending["a"], timeout=30)
        second = threading.Event()
        queue._post("b", lambda: (seen.append(threading.get_ident()), second.set()))
        # The waiting thread takes the job when it is posted, not when its idle wait ends (an hour here).
        assert second.wait(60)
        queue.close()  # ends the idle wait at once
        assert queue._thread is None
    assert len(seen) == 2 and seen[0] == seen[1]


def _caches(blocks: int, seed: int | None) -> dict[str, torch.Tensor]:
    shape = BackendLayout.CPU.expected_shape(blocks, LAYOUT)
    gen = torch.Generator().manual_seed(seed or 0)
    return {
        f"layers.{i}": torch.randn(shape, generator=gen) if seed is not None else torch.zeros(shape)
        for i in range(LAYOUT.num_layers)
    }


@pytest.mark.parametrize("mode", ["stream", "auto"])
def test_worker_saves_and_loads_over_the_byte_stream(daemon_factory, mode: str) -> None:  # type: ignore[no-untyped-def]
    """``stream``, and ``auto`` where the daemon's segment cannot be mapped (gone from this host's /dev/shm,
    as for a daemon on another host): two-phase saves and loads through the byte stream, bit-exact."""
    daemon = daemon_factory()
    daemon.start()
    if mode == "auto":
        for path in SHM_DIR.glob(f"{daemon.prefix}.*"):
            path.unlink()
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    config = VllmConnectorConfig.from_extra_config(
        {"address": daemon.address, "chunk_tokens": 32, "data_plane": mode}, block_size=32
    )
    ns = identity.namespace()
    tokens = tuple(range(3 * 32))
    src = _caches(8, seed=5)
    with TierCacheClient.connect(daemon.address) as client:
        saver = WorkerSide(identity, client, config)
        saver.register_kv_caches(src)
        assert saver.stream_plane(ns) is not None
        first = SaveSpec("r", "", "", tokens, 0, (0, 1), (5, 1), commit=False)
        saver.wait_for_save(TierCacheMetadata(saves=[first]))
        saver.before_forward(TierCacheMetadata())
        saver.wait_for_save(TierCacheMetadata(saves=[SaveSpec("r", "", "", (), 0, (2,), (5, 1, 6), True)]))
        saver.shutdown()  # waits for the save thread
        assert saver.save_failures == 0
        assert client.lookup(ns, chunk_keys(ns, tokens)).chunks == 3

        dst = _caches(10, seed=None)
        loader = WorkerSide(identity, client, config)
        loader.register_kv_caches(dst)
        longer = tokens + tuple(range(1000, 1032))  # a fourth chunk the daemon does not hold
        load = LoadSpec("q", "", "", longer, (7, 2, 9, 3), first_block=1)
        loader.start_load_kv(TierCacheMetadata(loads=[load]))
        assert loader.get_block_ids_with_load_errors() == {3}
        for name in dst:
            got, want = dst[name], src[name]
            assert torch.equal(got[2], want[1]) and torch.equal(got[9], want[6])
            assert not got[7].any() and not got[3].any()  # below first_block; not cached
        loader.shutdown()
        assert client.stats().active_leases == 0


def test_an_unfinished_streamed_save_publishes_nothing(daemon: Daemon) -> None:
    identity = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
    config = VllmConnectorConfig.from_extra_config(
        {"address": daemon.address, "chunk_tokens": 32, "data_plane": "stream"}, block_size=32
    )
    ns = identity.namespace()
    tokens = tuple(range(500, 500 + 2 * 32))
    with TierCacheClient.connect(daemon.address) as client:
        worker = WorkerSide(identity, client, config)
        worker.register_kv_caches(_caches(4, seed=6))
        worker.wait_for_save(TierCacheMetadata(saves=[SaveSpec("r", "", "", tokens, 0, (0,), (1,), False)]))
        assert worker.open_saves == 1
        assert worker.get_finished({"r"}) <= {"r"}  # aborted: its staged chunk is dropped
        worker.shutdown()
        assert client.lookup(ns, chunk_keys(ns, tokens)).chunks == 0


def test_a_lease_neither_the_clock_nor_the_daemon_proves_fails_the_load(daemon: Daemon) -> None:
    keys = chunk_keys(NS, list(range(100, 132)))
    with TierCacheClient(parse_address(daemon.address), settle_after_s=600.0) as client:
        grant = client.begin_store(NS, keys)
        mapping = client.slot_mapping(NS)
        assert mapping is not None
        with mapping.use() as slots:
            slots.view(grant.slots[0]).fill_(7)
        assert client.commit_store(NS, grant.ticket_id) == 1
        lease = client.acquire_load(NS, keys)
        assert client.release_load(NS, lease.lease_id)  # gone before the copy ends: its slots may be reused
        caches = [
            block_planes(BackendLayout.CPU, torch.zeros(BackendLayout.CPU.expected_shape(4, LAYOUT)))
            for _ in range(LAYOUT.num_layers)
        ]
        leased = LeasedLoad(NS, lease, lease.slots, mapping, (1,), 0, started=0.0)
        load = leased.start(client, LAYOUT, caches, clock=lambda: 1e12)  # the clock proves nothing
        assert load.result().tokens_loaded == 0  # the daemon did not confirm the lease: vLLM recomputes

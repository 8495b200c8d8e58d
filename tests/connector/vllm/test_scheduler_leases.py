"""The one-round-trip load on a real daemon, without an engine: the scheduler leases, the worker copies.

The scheduler side and the worker side each get their own client (their own connection, as in vLLM's
multiprocess mode, where they live in EngineCore and in the Worker). vLLM's requests and scheduler outputs
are stood in for by plain objects with the fields the connector reads; the daemon, its leases, the shared
memory and the copies are real.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.conftest import connector_daemon
from tiercache.connector import TierCacheClient
from tiercache.connector.channel import parse_address
from tiercache.connector.paged import chunk_layer_planes
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.metadata import TierCacheMetadata
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.scheduler import SchedulerSide
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.policies.load import LoadPolicyKind
from tiercache.testing.daemon import DaemonProcess as Daemon

LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)  # 64 KiB: one daemon slot
IDENTITY = EngineIdentity("tiny", "", BackendLayout.CPU, LAYOUT)
NS = IDENTITY.namespace()
PROMPT_TOKENS = 3 * 32 + 5  # 3 full chunks and a tail
BLOCKS = [7, 3, 5, 1]  # the request's blocks (the fourth holds the tail vLLM computes)


def _prompt(first: int) -> list[int]:
    """A prompt of its own for each test (the tests share one daemon)."""
    return list(range(first, first + PROMPT_TOKENS))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One daemon for the module (each test leaves no lease behind, which the next one checks)."""
    d = connector_daemon(tmp_path_factory.mktemp("lease-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@dataclass
class _Request:
    """The fields of a vLLM ``Request`` the scheduler side reads."""

    request_id: str
    prompt_token_ids: list[int]
    lora_request: Any = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


def _step(new: list[tuple[str, list[int]]] = (), preempted: tuple[str, ...] = ()) -> Any:  # type: ignore[assignment]
    """A scheduler output scheduling the whole prompt of each new request (nothing computed before)."""
    return SimpleNamespace(
        preempted_req_ids=set(preempted),
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=(b,), num_computed_tokens=0) for r, b in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]
        ),
        num_scheduled_tokens={r: PROMPT_TOKENS for r, _ in new},
    )


def _config(address: str, published_index: bool = False) -> VllmConnectorConfig:
    """The connector's config; every lookup asks the daemon unless ``published_index`` (these tests look at
    the calls; :mod:`.test_published_hits` at the answers with none)."""
    return VllmConnectorConfig(
        address, None, LoadPolicyKind.WAIT_COMPLETE, 5.0, LAYOUT.chunk_tokens, published_index=published_index
    )


def _active_leases(daemon: Daemon) -> int:
    with TierCacheClient.connect(daemon.address) as other:
        return other.stats().active_leases


def _store_chunks(daemon: Daemon, prompt: list[int]) -> list[torch.Tensor]:
    """Store the prompt's 3 full chunks (random bytes); their bytes."""
    gen = torch.Generator().manual_seed(5)
    chunks = [
        torch.randint(0, 256, (LAYOUT.chunk_bytes,), dtype=torch.uint8, generator=gen) for _ in range(3)
    ]
    with TierCacheClient.connect(daemon.address) as client:
        grant = client.begin_store(NS, chunk_keys(NS, prompt[: 3 * 32]))
        mapping = client.slot_mapping(NS)
        assert mapping is not None
        with mapping.use() as slots:
            for ref in grant.slots:
                slots.view(ref).copy_(chunks[ref.index])
        assert client.commit_store(NS, grant.ticket_id) == 3
    return chunks


def _client(daemon: Daemon) -> TierCacheClient:
    return TierCacheClient(parse_address(daemon.address), settle_after_s=600.0)  # releases wait for settle()


@pytest.mark.parametrize("lapsed", [False, True], ids=["in-time", "clock-lapsed"])
def test_scheduler_leases_and_the_worker_copies_and_releases(daemon: Daemon, lapsed: bool) -> None:
    prompt = _prompt(1000 if lapsed else 2000)
    chunks = _store_chunks(daemon, prompt)
    with _client(daemon) as sched_client, _client(daemon) as worker_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address))
        req = _Request("r", prompt)
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
        assert sched.held_leases == 1 and _active_leases(daemon) == 1  # leased by the lookup itself
        sched.update_state_after_alloc(req, None, 3 * 32)
        meta = sched.build_connector_meta(_step([("r", BLOCKS)]))
        assert sched.held_leases == 0 and meta.loads[0].lease is not None  # handed to the worker

        # A clock past the lease's TTL makes the worker confirm the lease with a waited release.
        worker = WorkerSide(
            IDENTITY, worker_client, _config(daemon.address), clock=lambda: 1e12 if lapsed else 0.0
        )
        shape = BackendLayout.CPU.expected_shape(8, LAYOUT)
        caches = {f"layer.{i}": torch.zeros(shape) for i in range(LAYOUT.num_layers)}
        worker.register_kv_caches(caches)
        worker.start_load_kv(meta)
        worker.wait_for_layer_load("layer.1")
        assert worker.get_block_ids_with_load_errors() == set()
        for layer, cache in enumerate(worker._caches):
            for block, chunk in zip(BLOCKS, chunks):
                assert torch.equal(cache[:, block], chunk_layer_planes(LAYOUT, chunk, layer, 1)[:, 0])
            assert not cache[:, [0, 2, 4, 6]].any()
        assert _active_leases(daemon) == (0 if lapsed else 1)  # in time: the release waits for a call
        worker_client.settle()
        assert _active_leases(daemon) == 0  # the worker's connection released the scheduler's lease
        assert sched.request_finished(req, BLOCKS) == (False, None)  # every full chunk was cached: no save
        worker.shutdown()
        sched.shutdown()


def test_unscheduled_finished_or_local_requests_release_their_lease(daemon: Daemon) -> None:
    prompt = _prompt(3000)
    _store_chunks(daemon, prompt)
    with _client(daemon) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
        req = _Request("r", prompt)
        assert sched.get_num_new_matched_tokens(req, 0)[0] == 3 * 32
        meta = sched.build_connector_meta(_step())  # not scheduled (no blocks): kept for its retries
        assert meta.loads == [] and sched.held_leases == 1
        assert sched.get_num_new_matched_tokens(req, 0)[0] == 3 * 32  # tried again: the same lease
        assert sched.held_leases == 1
        assert sched.request_finished(req, []) == (False, None)  # aborted while waiting
        assert sched.held_leases == 0
        client.settle()
        assert _active_leases(daemon) == 0

        local = _Request("local", prompt)
        assert sched.get_num_new_matched_tokens(local, 3 * 32)[0] == 0  # vLLM has the prefix itself
        sched.update_state_after_alloc(local, None, 0)
        assert sched.held_leases == 0
        meta = sched.build_connector_meta(_step([("local", BLOCKS)]))
        assert meta.loads == []
        client.settle()
        assert _active_leases(daemon) == 0
        sched.shutdown()


def test_a_disabled_worker_reports_the_blocks_and_releases_the_lease(daemon: Daemon) -> None:
    prompt = _prompt(4000)
    _store_chunks(daemon, prompt)
    with _client(daemon) as sched_client, _client(daemon) as worker_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address))
        req = _Request("r", prompt)
        sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, None, 3 * 32)
        meta: TierCacheMetadata = sched.build_connector_meta(_step([("r", BLOCKS)]))
        worker = WorkerSide(IDENTITY, worker_client, _config(daemon.address))  # no KV caches registered
        worker.start_load_kv(meta)
        assert worker.get_block_ids_with_load_errors() == set(BLOCKS[:3])  # vLLM recomputes them
        worker_client.settle()
        assert _active_leases(daemon) == 0
        worker.shutdown()
        sched.shutdown()

"""Answers from the daemon's published L2 index: no call for a prompt whose next chunk the index holds, the
copy checked afterwards, a chunk dropped in between a load error (vLLM recomputes), never wrong bytes.

A real daemon and its shared memory; the scheduler and the worker each with their own client; vLLM's
requests and scheduler outputs stood in for by plain objects (as in :mod:`.test_scheduler_leases`).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.conftest import connector_daemon
from tests.connector.vllm.test_scheduler_calls import CountingClient
from tests.connector.vllm.test_scheduler_leases import (
    BLOCKS,
    IDENTITY,
    LAYOUT,
    NS,
    _active_leases,
    _client,
    _config,
    _prompt,
    _Request,
    _step,
    _store_chunks,
)
from tiercache.connector import TierCacheClient
from tiercache.connector.paged import chunk_layer_planes
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.metadata import TierCacheMetadata
from tiercache.connector.vllm.scheduler import SchedulerSide
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.errors import InvalidArgumentError
from tiercache.testing.daemon import DaemonProcess as Daemon
from tiercache.tiers.base import TierLevel


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = connector_daemon(tmp_path_factory.mktemp("published-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def _warm(sched: SchedulerSide, daemon: Daemon, first: int) -> None:
    """One request answered by a call: the scheduler maps the pool it leases from (and its index)."""
    prompt = _prompt(first)
    _store_chunks(daemon, prompt)
    req = _Request(f"warm-{first}", prompt)
    assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
    sched.request_finished(req, [])


def _worker(daemon: Daemon, client: TierCacheClient) -> WorkerSide:
    worker = WorkerSide(IDENTITY, client, _config(daemon.address), clock=lambda: 0.0)
    shape = BackendLayout.CPU.expected_shape(8, LAYOUT)
    worker.register_kv_caches({f"layer.{i}": torch.zeros(shape) for i in range(LAYOUT.num_layers)})
    return worker


def _l2_hits(daemon: Daemon) -> int:
    with TierCacheClient.connect(daemon.address) as other:
        return next(t.hits for t in other.stats().tiers if t.level is TierLevel.L2)


def _plan(sched: SchedulerSide, req: _Request) -> TierCacheMetadata:
    sched.update_state_after_alloc(req, None, 3 * 32)
    return sched.build_connector_meta(_step([(req.request_id, BLOCKS)]))


def test_a_prompt_the_index_holds_is_answered_with_no_call_and_loaded_exactly(daemon: Daemon) -> None:
    with CountingClient(daemon.address) as sched_client, _client(daemon) as worker_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address, published_index=True))
        _warm(sched, daemon, 10_000)
        calls = len(sched_client.calls)
        prompt = _prompt(11_000)
        chunks = _store_chunks(daemon, prompt)
        req = _Request("r", prompt)
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
        assert len(sched_client.calls) == calls and sched.index_answers == 1  # no call
        meta = _plan(sched, req)
        (spec,) = meta.loads
        assert spec.lease is not None and spec.lease.lease_id == 0 and len(spec.published) == 3

        worker = _worker(daemon, worker_client)
        hits = _l2_hits(daemon)
        worker.start_load_kv(meta)
        assert worker.get_block_ids_with_load_errors() == set()
        for layer, cache in enumerate(worker._caches):
            for i in range(3):
                want = chunk_layer_planes(LAYOUT, chunks[i], layer, 1)[:, 0]
                assert torch.equal(cache[:, BLOCKS[i]], want)
        assert worker.loaded_tokens == {TierLevel.L2: 3 * 32}
        worker_client.settle()
        assert _l2_hits(daemon) == hits + 3  # each chunk read counts as a read of its L2 copy
        sched_client.settle()
        assert _active_leases(daemon) == 0
        worker.shutdown()
        sched.shutdown()


def test_a_chunk_dropped_between_the_answer_and_the_copy_is_a_load_error(daemon: Daemon) -> None:
    with CountingClient(daemon.address) as sched_client, _client(daemon) as worker_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address, published_index=True))
        _warm(sched, daemon, 20_000)
        prompt = _prompt(21_000)
        _store_chunks(daemon, prompt)
        req = _Request("r", prompt)
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
        meta = _plan(sched, req)
        with TierCacheClient.connect(daemon.address) as other:
            assert other.purge(NS) > 0  # every chunk of the namespace goes, their pages may be reused
        worker = _worker(daemon, worker_client)
        worker.start_load_kv(meta)
        assert worker.get_block_ids_with_load_errors() == set(BLOCKS[:3])  # vLLM recomputes them
        assert worker.load_failures == 1 and worker.loaded_tokens == {}
        worker.shutdown()
        sched.shutdown()


def test_a_prompt_whose_next_chunk_the_index_lacks_asks_the_daemon(daemon: Daemon) -> None:
    with CountingClient(daemon.address) as sched_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address, published_index=True))
        _warm(sched, daemon, 30_000)
        calls = len(sched_client.calls)
        req = _Request("new", _prompt(31_000))  # never stored
        assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
        assert len(sched_client.calls) == calls + 1 and sched.index_answers == 0
        sched.request_finished(req, [])
        sched.shutdown()


def test_without_the_index_every_lookup_asks_the_daemon(daemon: Daemon) -> None:
    with CountingClient(daemon.address) as sched_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address, published_index=False))
        _warm(sched, daemon, 40_000)
        prompt = _prompt(41_000)
        _store_chunks(daemon, prompt)
        req = _Request("r", prompt)
        calls = len(sched_client.calls)
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
        assert len(sched_client.calls) == calls + 1 and sched.index_answers == 0
        sched.request_finished(req, [])
        sched_client.settle()
        sched.shutdown()


def test_the_option_is_checked_and_off_under_cost_aware() -> None:
    with pytest.raises(InvalidArgumentError, match="published_index"):
        VllmConnectorConfig.from_extra_config({"published_index": "yes"}, 32)
    assert VllmConnectorConfig.from_extra_config({}, 32).published_index
    cost_aware = {"load_policy": "cost_aware", "prefill_tokens_per_s": 1000.0}
    assert not VllmConnectorConfig.from_extra_config(cost_aware, 32).published_index

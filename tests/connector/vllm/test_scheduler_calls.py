"""What the scheduler side asks the daemon, and when: no call when tiercache cannot help, only the chunks
vLLM lacks, one answer per waiting request, per-request control through ``kv_transfer_params``.

A real daemon; the scheduler's client counts the lookups it sends (how many keys each), and the daemon's own
lease count and the worker's copies say what the calls did. vLLM's requests and scheduler outputs are stood
in for by plain objects with the fields the connector reads.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.conftest import connector_daemon
from tests.connector.vllm.test_scheduler_leases import (
    BLOCKS,
    IDENTITY,
    LAYOUT,
    PROMPT_TOKENS,
    _active_leases,
    _client,
    _config,
    _prompt,
    _Request,
    _store_chunks,
)
from tiercache.connector import TierCacheClient
from tiercache.connector.channel import parse_address
from tiercache.connector.paged import chunk_layer_planes
from tiercache.connector.vllm.asking import MISS_RUN
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.params import SKIP_LOAD, SKIP_SAVE
from tiercache.connector.vllm.scheduler import ASK_WAIT_S, HOLD_FRACTION, SchedulerSide
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.errors import InvalidArgumentError
from tiercache.keys import Namespace
from tiercache.testing.daemon import DaemonProcess as Daemon

LEASE_TTL_S = 2.0  # the directory's daemons (tests/connector/conftest.py)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One daemon for the module (each test leaves no lease behind)."""
    d = connector_daemon(tmp_path_factory.mktemp("calls-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.fixture(autouse=True)
def _answers_are_awaited(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests look at what is asked and answered, not at a late answer: the scheduler waits for every
    answer (a loaded host can take longer than ASK_WAIT_S); the late-answer test sets its own wait."""
    monkeypatch.setattr("tiercache.connector.vllm.scheduler.ASK_WAIT_S", 600.0)


class CountingClient(TierCacheClient):
    """A real client that records the lookups it sends: per call, how many keys each chain carries."""

    def __init__(self, address: str) -> None:
        super().__init__(parse_address(address), settle_after_s=600.0)
        self.calls: list[list[int]] = []

    @property
    def asked(self) -> list[int]:
        """The calls that carried one chain: its keys."""
        return [chains[0] for chains in self.calls if len(chains) == 1]

    def acquire_load(self, namespace: Namespace, keys: Sequence[bytes], *args: Any, **kwargs: Any) -> Any:
        self.calls.append([len(keys), *(len(more) for more in kwargs.get("more_chains", ()))])
        return super().acquire_load(namespace, keys, *args, **kwargs)

    def lookup(self, namespace: Namespace, keys: Sequence[bytes], *args: Any, **kwargs: Any) -> Any:
        self.calls.append([len(keys)])
        return super().lookup(namespace, keys, *args, **kwargs)


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _step(new: list[tuple[str, list[int], int]] = ()) -> Any:  # type: ignore[assignment]
    """A scheduler output scheduling the rest of each new request's prompt (``(id, blocks, computed)``)."""
    return SimpleNamespace(
        preempted_req_ids=set(),
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, block_ids=(b,), num_computed_tokens=c) for r, b, c in new
        ],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]
        ),
        num_scheduled_tokens={r: PROMPT_TOKENS - c for r, _, c in new},
    )


def test_no_daemon_call_when_tiercache_cannot_add_a_block(daemon: Daemon) -> None:
    prompt = _prompt(5000)
    _store_chunks(daemon, prompt)
    with CountingClient(daemon.address) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
        # vLLM's own prefix cache holds every block tiercache could offer (never the last token's)
        assert sched.get_num_new_matched_tokens(_Request("covered", prompt), 3 * 32) == (0, False)
        # shorter than a chunk, and one chunk whose only block holds the last token
        assert sched.get_num_new_matched_tokens(_Request("short", prompt[:20]), 0) == (0, False)
        assert sched.get_num_new_matched_tokens(_Request("one", prompt[:32]), 0) == (0, False)
        assert client.calls == [] and sched.lookups == 0
        assert sched.get_num_new_matched_tokens(_Request("control", prompt), 0) == (3 * 32, False)
        assert client.asked == [3]
        assert sched.request_finished(_Request("control", prompt), []) == (False, None)
        client.settle()
        assert _active_leases(daemon) == 0
        sched.shutdown()


def test_only_the_chunks_beyond_vllms_are_leased_and_loaded(daemon: Daemon) -> None:
    prompt = _prompt(6000)
    chunks = _store_chunks(daemon, prompt)
    with CountingClient(daemon.address) as sched_client, _client(daemon) as worker_client:
        sched = SchedulerSide(IDENTITY, sched_client, _config(daemon.address))
        req = _Request("r", prompt)
        assert sched.get_num_new_matched_tokens(req, 2 * 32) == (32, False)  # vLLM has 2 chunks
        assert sched_client.asked == [1]  # asked about the third chunk only
        sched.update_state_after_alloc(req, None, 32)
        meta = sched.build_connector_meta(_step([("r", BLOCKS, 2 * 32)]))
        (spec,) = meta.loads
        assert spec.first_block == 2 and spec.lease is not None
        assert [r.index for r in spec.lease.slots] == [2]  # numbered by position in the prompt

        worker = WorkerSide(IDENTITY, worker_client, _config(daemon.address), clock=lambda: 0.0)
        shape = BackendLayout.CPU.expected_shape(8, LAYOUT)
        worker.register_kv_caches({f"layer.{i}": torch.zeros(shape) for i in range(LAYOUT.num_layers)})
        worker.start_load_kv(meta)
        worker.wait_for_layer_load("layer.1")
        assert worker.get_block_ids_with_load_errors() == set()
        for layer, cache in enumerate(worker._caches):
            want = chunk_layer_planes(LAYOUT, chunks[2], layer, 1)[:, 0]
            assert torch.equal(cache[:, BLOCKS[2]], want)  # the third chunk, into the third block
            assert not cache[:, BLOCKS[:2]].any()  # vLLM's blocks: not written
        worker_client.settle()
        assert _active_leases(daemon) == 0
        worker.shutdown()
        sched.shutdown()


def test_a_waiting_request_keeps_its_answer_and_lease_while_young(daemon: Daemon) -> None:
    prompt = _prompt(7000)
    _store_chunks(daemon, prompt)
    clock = Clock()
    with CountingClient(daemon.address) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address), clock=clock)
        req = _Request("r", prompt)
        for _ in range(3):  # asked, no blocks for it: not scheduled; retried at the next steps
            assert sched.get_num_new_matched_tokens(req, 0) == (3 * 32, False)
            assert sched.build_connector_meta(_step()).loads == []
            clock.now += 0.1
        assert client.asked == [3]  # one lookup, one lease for all the retries
        client.settle()
        assert _active_leases(daemon) == 1 and sched.held_leases == 1
        assert sched.get_num_new_matched_tokens(req, 32) == (2 * 32, False)  # vLLM got a block meanwhile
        sched.update_state_after_alloc(req, None, 2 * 32)
        meta = sched.build_connector_meta(_step([("r", BLOCKS, 32)]))
        assert meta.loads[0].lease is not None and meta.loads[0].first_block == 1
        assert client.asked == [3] and sched.held_leases == 0
        client.defer_release(IDENTITY.namespace(), meta.loads[0].lease.lease_id)  # (the worker's job)

        old = _Request("old", prompt)
        assert sched.get_num_new_matched_tokens(old, 0)[0] == 3 * 32
        clock.now += HOLD_FRACTION * LEASE_TTL_S  # the lease is no longer young: released at the step
        sched.build_connector_meta(_step())
        assert sched.held_leases == 0
        client.settle()
        assert _active_leases(daemon) == 0
        assert sched.get_num_new_matched_tokens(old, 0)[0] == 3 * 32  # asked again
        assert client.asked == [3, 3, 3]
        assert sched.request_finished(old, []) == (False, None)  # aborted while waiting: released
        client.settle()
        assert _active_leases(daemon) == 0
        sched.shutdown()


def test_kv_transfer_params_skip_load_and_save(daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    prompt = _prompt(8000)
    _store_chunks(daemon, prompt)
    fresh = _prompt(9000)  # nothing of it is cached
    with CountingClient(daemon.address) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
        skip_load = _Request("skip-load", prompt)
        skip_load.kv_transfer_params = {SKIP_LOAD: True, "do_remote_prefill": False}  # (another's key)
        assert sched.get_num_new_matched_tokens(skip_load, 0) == (0, False)
        assert client.calls == []
        sched.update_state_after_alloc(skip_load, None, 0)

        skip_save = _Request("skip-save", fresh)
        skip_save.kv_transfer_params = {SKIP_SAVE: True}
        saves = _Request("saves", _prompt(9500))
        for r in (skip_save, saves):
            assert sched.get_num_new_matched_tokens(r, 0) == (0, False)
            sched.update_state_after_alloc(r, None, 0)
        assert client.asked == [3, 3]  # both looked up
        meta = sched.build_connector_meta(
            _step([("skip-load", BLOCKS, 0), ("skip-save", [0, 2, 4, 6], 0), ("saves", [8, 9, 10, 11], 0)])
        )
        assert meta.loads == []
        assert [s.req_id for s in meta.saves] == ["skip-load", "saves"]  # skip-load still saves

        caplog.set_level(logging.WARNING, logger="tiercache.connector.vllm.params")
        bad = _Request("bad", prompt)
        bad.kv_transfer_params = {SKIP_LOAD: "yes"}
        assert sched.get_num_new_matched_tokens(bad, 0) == (3 * 32, False)  # the default: it loads
        assert f"kv_transfer_params.{SKIP_LOAD} must be true or false" in caplog.text
        typo = _Request("typo", prompt)
        typo.kv_transfer_params = {"tiercache_skip_laod": True}
        sched.get_num_new_matched_tokens(typo, 0)
        assert "kv_transfer_params.tiercache_skip_laod is not a tiercache key" in caplog.text
        for r in (bad, typo, skip_load, skip_save, saves):
            sched.request_finished(r, [])
        client.settle()
        assert _active_leases(daemon) == 0
        sched.shutdown()


def test_the_requests_that_arrived_together_are_looked_up_in_one_call(daemon: Daemon) -> None:
    a, b = _prompt(10000), _prompt(11000)
    _store_chunks(daemon, a)
    _store_chunks(daemon, b)
    c = a[: 2 * 32] + _prompt(12000)[2 * 32 :]  # A's first two chunks, then its own
    local = {"b": 32}  # vLLM's own prefix cache holds B's first block
    with CountingClient(daemon.address) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
        sched.bind_local_hit(lambda request: local.get(request.request_id, 0))
        reqs = {r.request_id: r for r in (_Request("a", a), _Request("b", b), _Request("c", c))}
        reqs["short"] = _Request("short", a[:20])
        for r in reqs.values():
            sched.on_new_request(r)
        assert sched.get_num_new_matched_tokens(reqs["a"], 0) == (3 * 32, False)
        # one call: A whole, B beyond vLLM's block, C beyond the chunks A brings; none for the short one
        assert client.calls == [[3, 2, 1]] and sched.lookups == 1
        assert sched.get_num_new_matched_tokens(reqs["b"], 32) == (2 * 32, False)
        assert sched.get_num_new_matched_tokens(reqs["c"], 2 * 32) == (0, False)  # its own chunk: a miss
        assert sched.get_num_new_matched_tokens(reqs["short"], 0) == (0, False)
        assert client.calls == [[3, 2, 1]]  # answered without a call
        client.settle()
        assert _active_leases(daemon) == 2 and sched.held_leases == 2

        # C tried again while vLLM lacks A's blocks (A was not scheduled): asked again, alone
        sched.request_finished(reqs["c"], [])
        again = _Request("c2", c)
        assert sched.get_num_new_matched_tokens(again, 0) == (2 * 32, False)
        assert client.calls == [[3, 2, 1], [3]]
        for r in (*reqs.values(), again):
            sched.request_finished(r, [])
        client.settle()
        assert _active_leases(daemon) == 0
        sched.shutdown()


def test_the_daemon_refuses_too_many_chains_naming_the_field(daemon: Daemon) -> None:
    with TierCacheClient.connect(daemon.address) as client:
        keys = [bytes([i % 256, i // 256]) * 16 for i in range(300)]
        with pytest.raises(InvalidArgumentError, match="more_chains"):
            client.acquire_load(IDENTITY.namespace(), keys[:1], more_chains=[[k] for k in keys[1:]])
        lease = client.acquire_load(IDENTITY.namespace(), keys[:1], more_chains=[[k] for k in keys[1:3]])
        assert len(lease.more) == 2  # the daemon is still up (and answers every chain)


def _answered(sched: SchedulerSide, request: Any) -> tuple[int | None, bool]:
    """vLLM's question asked again every step (10 ms) until the answer is there (no clock asserted)."""
    got: tuple[int | None, bool] = (None, False)
    for _ in range(3000):
        got = sched.get_num_new_matched_tokens(request, 0)
        if got != (None, False):
            break
        time.sleep(0.01)
    return got


def test_a_late_answer_lets_the_running_requests_go_on(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # The scheduler waited for every AcquireLoad while vLLM's running requests waited with it (py-spy of
    # vllm serve, chat outgrowing its cache at concurrency 8: 15 % of EngineCore's time). Now a request
    # whose answer is late is skipped for the step (None: vLLM asks again) while others run.
    monkeypatch.setattr("tiercache.connector.vllm.scheduler.ASK_WAIT_S", ASK_WAIT_S)
    daemon = connector_daemon(tmp_path / "late-daemon")
    try:
        daemon.start()
        prompt = _prompt(7000)
        _store_chunks(daemon, prompt)
        with _client(daemon) as client:
            sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
            # Nothing runs: the scheduler waits for the answer.
            assert sched.get_num_new_matched_tokens(_Request("first", prompt), 0) == (3 * 32, False)
            sched.update_state_after_alloc(_Request("first", prompt), None, 0)  # (vLLM took none of it)
            sched.build_connector_meta(_step([("first", BLOCKS, 0)]))  # a step ran requests
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                late = _Request("late", prompt)
                assert sched.get_num_new_matched_tokens(late, 0) == (None, False)
                gone = _Request("gone", prompt)
                assert sched.get_num_new_matched_tokens(gone, 0) == (None, False)
                sched.request_finished(gone, [])  # vLLM dropped it before its answer came
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            got = _answered(sched, late)
            assert got == (3 * 32, False)
            assert sched.late_answers >= 2  # late and gone skipped a step each (late maybe more)
            assert sched.ask_wait_s >= 2 * ASK_WAIT_S  # each waited the whole bound (the daemon was stopped)
            assert sched.held_leases == 1  # late's; gone's lease was released when its answer came
            sched.request_finished(late, [])
            sched.shutdown()
            client.settle()
        assert _active_leases(daemon) == 0
    finally:
        daemon.cleanup()


class HeldClient(CountingClient):
    """A real client whose first AcquireLoad waits for the test before it is sent (an answer that takes long,
    as one promoting a prompt's chunks from L3 under load)."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.holding = threading.Event()
        self.release = threading.Event()

    def acquire_load(self, namespace: Namespace, keys: Sequence[bytes], *args: Any, **kwargs: Any) -> Any:
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(60)
        return super().acquire_load(namespace, keys, *args, **kwargs)


def test_a_slow_answer_does_not_hold_up_the_next_steps_answers(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One ask thread made every batch wait for the one before it: under vllm serve with L3 serving, an
    # AcquireLoad promoting a prompt took 13-15 ms (p90 32-100), and the next steps' batches queued behind
    # it (p99 of the wait for the thread 20-134 ms), each a step skipped for a late answer.
    monkeypatch.setattr("tiercache.connector.vllm.scheduler.ASK_WAIT_S", ASK_WAIT_S)
    slow_prompt, quick_prompt = _prompt(31000), _prompt(32000)
    _store_chunks(daemon, slow_prompt)
    _store_chunks(daemon, quick_prompt)
    with HeldClient(daemon.address) as client:
        sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
        sched.build_connector_meta(_step([("running", BLOCKS, 0)]))  # a step ran requests
        try:
            slow = _Request("slow", slow_prompt)
            assert sched.get_num_new_matched_tokens(slow, 0) == (None, False)
            assert client.holding.wait(60)
            quick = _Request("quick", quick_prompt)
            got = _answered(sched, quick)
            assert got == (3 * 32, False)  # while the slow answer is still held
            assert not client.release.is_set()
        finally:
            client.release.set()
        got = _answered(sched, slow)
        assert got == (3 * 32, False)
        for request in (slow, quick):
            sched.request_finished(request, [])
        sched.shutdown()
        client.settle()
    assert _active_leases(daemon) == 0


def _miss_run(sched: SchedulerSide) -> None:
    """Ask about MISS_RUN new prompts with nothing running: each answer is awaited, each a miss."""
    for i in range(MISS_RUN):
        request = _Request(f"new{i}", _prompt(20000 + 1000 * i))
        assert sched.get_num_new_matched_tokens(request, 0) == (0, False)


def test_after_a_run_of_misses_a_busy_step_does_not_wait(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # With a working set that fits vLLM's cache every lookup is a miss, yet a busy step waited for each
    # (1.4 ms median under vllm serve, the running requests waiting with it; 10 % late, a step each). After
    # MISS_RUN answers without a hit a busy step no longer waits: the request computes its prompt; the
    # answer still comes, its lease is released, and a hit in it makes the next steps wait again.
    monkeypatch.setattr("tiercache.connector.vllm.scheduler.ASK_WAIT_S", ASK_WAIT_S)
    daemon = connector_daemon(tmp_path / "outlook-daemon")
    try:
        daemon.start()
        stored = _prompt(9000)
        _store_chunks(daemon, stored)
        with _client(daemon) as client:
            sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
            _miss_run(sched)
            sched.build_connector_meta(_step([("new0", BLOCKS, 0)]))  # a step ran requests
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                late = _Request("late", stored)
                assert sched.get_num_new_matched_tokens(late, 0) == (0, False)  # not None: it went on
                assert sched.unawaited == 1
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            sched.build_connector_meta(_step())  # nothing runs: the next answer is awaited
            probe = _Request("probe", stored)
            assert sched.get_num_new_matched_tokens(probe, 0) == (3 * 32, False)  # (answered after late's)
            sched.build_connector_meta(_step())  # takes late's answer: a hit, its lease released
            assert sched.get_num_new_matched_tokens(late, 0) == (0, False)  # late computes its prompt
            assert sched.held_leases == 1  # probe's only
            sched.build_connector_meta(_step([("probe", BLOCKS, 0)]))  # busy again, hits seen: it waits
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                assert sched.get_num_new_matched_tokens(_Request("again", stored), 0) == (None, False)
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            for req in (late, probe, _Request("again", stored)):
                sched.request_finished(req, [])
            sched.shutdown()
            client.settle()
        assert _active_leases(daemon) == 0
    finally:
        daemon.cleanup()


def test_after_a_run_of_misses_a_follow_up_of_a_saved_prompt_is_still_awaited(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    # The serve record with the run of misses alone: 168 of 169 and 223 of 225 follow-up turns got their
    # whole previous turn back (169 and 225 before): a follow-up whose answer was late went on without it.
    # A request asking about a chunk this engine saved is awaited as before; any other goes on.
    monkeypatch.setattr("tiercache.connector.vllm.scheduler.ASK_WAIT_S", ASK_WAIT_S)
    daemon = connector_daemon(tmp_path / "follow-daemon")
    try:
        daemon.start()
        with _client(daemon) as client:
            sched = SchedulerSide(IDENTITY, client, _config(daemon.address))
            _miss_run(sched)
            own = _Request("own", _prompt(50000))
            assert sched.get_num_new_matched_tokens(own, 0) == (0, False)
            sched.build_connector_meta(_step([("own", BLOCKS, 0)]))  # busy; own's chunks are being saved
            os.kill(daemon.pid, signal.SIGSTOP)
            try:
                follow = _Request("follow", _prompt(50000))  # asks about own's first chunk on
                assert sched.get_num_new_matched_tokens(follow, 0) == (None, False)
                other = _Request("other", _prompt(60000))
                assert sched.get_num_new_matched_tokens(other, 0) == (0, False)
            finally:
                os.kill(daemon.pid, signal.SIGCONT)
            for req in (own, follow, other):
                sched.request_finished(req, [])
            sched.shutdown()
            client.settle()
        assert _active_leases(daemon) == 0
    finally:
        daemon.cleanup()

"""The daemon's hit counters against vLLM's own: real vLLM engines (CPU, tiny Llama) on a real daemon.

What the daemon counts as loaded (``load_success_tokens``) and as effective (``effective_hit_tokens``) per
tier must be what vLLM actually skipped thanks to tiercache: the tokens it did not compute
(``num_cached_tokens`` of each output) less what its own prefix cache gave (``vllm:prefix_cache_hits``).
A lease the scheduler takes for a prompt whose prefix vLLM holds itself, released unused, counts nothing;
what the worker was asked to load and could not is counted as recomputed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.conftest import connector_daemon
from tests.connector.vllm.conftest import CHUNK, RunVllm, extra, prompt
from tiercache.connector import TierCacheClient
from tiercache.connector.vllm.config import VllmConnectorConfig
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.metadata import LoadSpec, TierCacheMetadata
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.stats import StatsTaker, worker_counters
from tiercache.connector.vllm.worker import WorkerSide
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.stats import CacheStats
from tiercache.testing.daemon import DaemonProcess as Daemon
from tiercache.testing.waits import wait_until
from tiercache.tiers.base import TierLevel

DOC = prompt(41, 5 * CHUNK + 20)  # 5 full chunks and a tail
SETTLE_S = 30.0
"""How long the engine's last usage report may take to reach the daemon after the engine exits."""


@pytest.fixture(scope="module")
def hits_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = connector_daemon(tmp_path_factory.mktemp("hits-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def _stats(daemon: Daemon) -> CacheStats:
    with TierCacheClient.connect(daemon.address) as client:
        return client.stats()


def _counts(stats: CacheStats) -> tuple[dict[TierLevel, int], dict[TierLevel, int], int]:
    """Loaded and effective tokens per tier, and recomputed tokens."""
    loaded = {t.level: t.load_success_tokens for t in stats.tiers}
    effective = {t.level: t.effective_hit_tokens for t in stats.tiers}
    return loaded, effective, stats.recomputed_tokens


def _minus(after: dict[TierLevel, int], before: dict[TierLevel, int]) -> dict[TierLevel, int]:
    return {level: n - before[level] for level, n in after.items() if n != before[level]}


_LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)


def _cpu_engine(model: str) -> EngineIdentity:
    """A CPU engine ``model`` with one-block chunks of 32 tokens."""
    return EngineIdentity(model, "", BackendLayout.CPU, _LAYOUT)


def _cpu_worker(
    daemon: Daemon, client: TierCacheClient, identity: EngineIdentity
) -> tuple[WorkerSide, list[str]]:
    """The worker of ``identity`` (4 blocks of KV cache) and its layer names."""
    config = VllmConnectorConfig.from_extra_config({"address": daemon.address, "chunk_tokens": 32}, 32)
    worker = WorkerSide(identity, client, config)
    names = [f"layers.{i}" for i in range(_LAYOUT.num_layers)]
    worker.register_kv_caches(
        {name: torch.zeros(BackendLayout.CPU.expected_shape(4, _LAYOUT)) for name in names}
    )
    return worker, names


@pytest.mark.parametrize("data_plane", ["shm", "stream"])
def test_loaded_and_effective_tokens_are_what_vllm_skipped(
    run_vllm: RunVllm, hits_daemon: Daemon, tmp_path: Path, data_plane: str
) -> None:
    conf = extra(hits_daemon.address, data_plane=data_plane)
    run_vllm(extra=conf, batches=[[{"tokens": DOC, "salt": data_plane}]])  # stores DOC's 5 chunks
    before = _counts(_stats(hits_daemon))

    # A fresh engine: 2 chunks from tiercache; then DOC, 2 chunks from its own cache and 3 from tiercache;
    # then DOC again, all of it in vLLM's own cache (a lease taken for it is released unused).
    first = {"tokens": DOC[: 2 * CHUNK] + prompt(42, 10), "salt": data_plane}
    again = {"tokens": DOC, "salt": data_plane}
    b = run_vllm(extra=conf, batches=[[first], [again], [again]], metrics=True)
    cached = [r["cached"] for batch in b["batches"] for r in batch]
    own = int(b["prefix_cache"]["vllm:prefix_cache_hits"])
    skipped = sum(cached) - own  # what vLLM did not compute thanks to tiercache
    assert cached == [2 * CHUNK, 5 * CHUNK, 5 * CHUNK] and own == 7 * CHUNK  # the scenario ran as planned
    assert skipped == int(b["prefix_cache"]["vllm:external_prefix_cache_hits"]) == 5 * CHUNK

    def counted() -> bool:
        loaded, _, _ = _counts(_stats(hits_daemon))
        return sum(_minus(loaded, before[0]).values()) >= skipped

    wait_until(counted, SETTLE_S, "the engine's usage reports")
    loaded, effective, recomputed = _counts(_stats(hits_daemon))
    by_tier = _minus(loaded, before[0])
    assert sum(by_tier.values()) == skipped
    assert _minus(effective, before[1]) == by_tier  # effective = loaded, tier by tier
    assert recomputed == before[2]  # every token asked for arrived


def test_a_partial_load_reports_what_it_wrote_and_what_vllm_recomputes(daemon: Daemon) -> None:
    """The worker alone: 2 of a prompt's 3 chunks cached, vLLM holds block 0 itself: the daemon counts
    block 1 (chunk 1) as loaded and effective, and block 2 (not cached) as recomputed."""
    identity = _cpu_engine("tiny")
    ns = identity.namespace()
    tokens = tuple(range(9000, 9000 + 3 * 32))
    with TierCacheClient.connect(daemon.address) as client:
        grant = client.begin_store(ns, chunk_keys(ns, tokens)[:2])
        assert client.commit_store(ns, grant.ticket_id) == 2
        before = _counts(client.stats())
        worker, _ = _cpu_worker(daemon, client, identity)
        spec = LoadSpec("r", "", "", tokens, (3, 1, 2), first_block=1)
        worker.start_load_kv(TierCacheMetadata(loads=[spec]))
        assert worker.get_block_ids_with_load_errors() == {2}
        worker.shutdown()
        loaded, effective, recomputed = _counts(client.stats())  # settles the deferred report first
    assert _minus(loaded, before[0]) == _minus(effective, before[1]) == {TierLevel.L2: 32}
    assert recomputed - before[2] == 32


def test_only_a_step_with_loads_moves_the_worker_counters(daemon: Daemon) -> None:
    """A decode step (no loads, no saves) moves no counter, so vLLM ships no connector stats with it (a
    counter that moved every step made vLLM carry, aggregate and export them every step); a step that loads
    moves ``load_seconds``."""
    identity = _cpu_engine("tiny-steps")
    ns = identity.namespace()
    tokens = tuple(range(9100, 9100 + 2 * 32))
    taker = StatsTaker()
    with TierCacheClient.connect(daemon.address) as client:
        grant = client.begin_store(ns, chunk_keys(ns, tokens))
        assert client.commit_store(ns, grant.ticket_id) == 2
        worker, names = _cpu_worker(daemon, client, identity)
        for _ in range(3):  # decode steps
            worker.start_load_kv(TierCacheMetadata())
            for name in names:
                worker.wait_for_layer_load(name)
            assert taker.take(worker_counters(worker)) is None
        worker.start_load_kv(TierCacheMetadata(loads=[LoadSpec("r", "", "", tokens, (1, 2), first_block=0)]))
        for name in names:
            worker.wait_for_layer_load(name)
        assert worker.get_block_ids_with_load_errors() == set()
        moved = taker.take(worker_counters(worker))
        worker.shutdown()
    assert moved is not None and moved.data["load_seconds"] > 0
    assert moved.data["loaded_tokens.L2"] == 2 * 32

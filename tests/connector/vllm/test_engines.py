"""Real vLLM engines (CPU, tiny random-weight Llama) on a real tiercache daemon.

Each engine is its own process. Outputs are greedy over float32, so "identical" means token for token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.conftest import connector_daemon
from tests.connector.vllm.conftest import CHUNK, RunVllm, extra, prompt, run_engine
from tiercache.connector import TierCacheClient
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import DaemonProcess as Daemon

SHARED_A = prompt(1, 5 * CHUNK)  # 5 full chunks shared by A's and B's first prompts
SHARED_B = prompt(2, 3 * CHUNK)
A_PROMPTS = [SHARED_A + prompt(3, 20), SHARED_B + prompt(4, 40)]
B_PROMPTS = [SHARED_A + prompt(5, 10), SHARED_B + prompt(6, 7)]


def _batch(prompts: list[list[int]], salt: str | None = None) -> list[dict[str, object]]:
    return [{"tokens": p, "salt": salt} for p in prompts]


def _tokens(result: dict[str, object], batch: int = 0) -> list[list[int]]:
    return [r["tokens"] for r in result["batches"][batch]]  # type: ignore[index]


def _cached(result: dict[str, object], batch: int = 0) -> list[int]:
    return [r["cached"] for r in result["batches"][batch]]  # type: ignore[index]


@pytest.fixture(scope="module")
def vllm_daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    d = connector_daemon(tmp_path_factory.mktemp("vllm-daemon"))
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


def test_second_engine_loads_shared_chunks_bit_exact(
    run_vllm: RunVllm, vllm_daemon: Daemon, tmp_path: Path
) -> None:
    a = run_vllm(record_dir=tmp_path / "a", extra=extra(vllm_daemon.address), batches=[_batch(A_PROMPTS)])
    b = run_vllm(record_dir=tmp_path / "b", extra=extra(vllm_daemon.address), batches=[_batch(B_PROMPTS)])
    plain = run_vllm(extra=None, batches=[_batch(B_PROMPTS)])

    assert _cached(a) == [0, 0]
    assert _cached(b) == [5 * CHUNK, 3 * CHUNK]  # every shared full chunk, from the daemon
    assert _tokens(b) == _tokens(plain)
    assert _stats(vllm_daemon).active_leases == 0  # the scheduler's leases, released after the loads
    loads = sorted((tmp_path / "b").glob("load-*.bin"))
    assert len(loads) == 5 + 3
    for load in loads:
        saved = tmp_path / "a" / load.name.replace("load-", "save-")
        assert saved.exists(), f"B loaded {load.name}, which A never saved"
        assert load.read_bytes() == saved.read_bytes()


def test_daemon_absent_or_killed_keeps_outputs(
    run_vllm: RunVllm, daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    first = [prompt(7, 4 * CHUNK + 5)]
    second = [first[0][: 4 * CHUNK] + prompt(8, 9), prompt(9, 70)]
    plain = run_vllm(extra=None, batches=[_batch(first), _batch(second)])

    absent = run_vllm(
        extra=extra(f"unix:{tmp_path / 'nobody.sock'}"), batches=[_batch(first), _batch(second)]
    )
    assert _tokens(absent, 0) == _tokens(plain, 0) and _tokens(absent, 1) == _tokens(plain, 1)

    daemon = daemon_factory()
    daemon.start()
    assert daemon.proc is not None
    killed = run_vllm(
        extra=extra(daemon.address), batches=[_batch(first), _batch(second)], kill_pid=daemon.proc.pid
    )
    assert daemon.proc.wait(30) != 0
    assert _tokens(killed, 0) == _tokens(plain, 0) and _tokens(killed, 1) == _tokens(plain, 1)
    assert "tiercache" in killed["stderr"]  # the failures were logged, not raised


def test_salt_lora_and_revision_never_hit(run_vllm: RunVllm, vllm_daemon: Daemon, tiny_lora: str) -> None:
    p = [prompt(10, 3 * CHUNK + 3)]
    stored = run_vllm(extra=extra(vllm_daemon.address), batches=[_batch(p, "tenant-a")])
    assert _cached(stored) == [0]
    other = run_vllm(
        extra=extra(vllm_daemon.address),
        batches=[_batch(p, "tenant-b"), _batch(p, "tenant-a")],
        revision="r2",
    )
    assert _cached(other, 0) == [0]  # another salt
    assert _cached(other, 1) == [0]  # the same salt, but another revision of the weights
    lora = [{"tokens": p[0], "salt": "tenant-a", "lora": tiny_lora}]
    same = run_vllm(extra=extra(vllm_daemon.address), batches=[_batch(p, "tenant-a"), lora])
    assert _cached(same, 0) == [3 * CHUNK]  # the control: the same salt and revision hit
    assert _cached(same, 1) == [0]  # the same salt and revision, through a LoRA adapter


LONG = prompt(11, 8 * CHUNK + 1)
HELD = prompt(14, 4 * CHUNK + 5)


@pytest.fixture(scope="module")
def aborted_and_held(  # type: ignore[no-untyped-def]
    tiny_model: str, vllm_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory
):
    """One engine: a request aborted mid-save, then a request finished while its commit is held back.

    Yields the daemon's stats before and after, and the engine's output.
    """
    before = _stats(vllm_daemon)
    out = run_engine(
        tiny_model,
        tmp_path_factory.mktemp("aborted-and-held"),
        extra=extra(vllm_daemon.address),
        connector="GatedConnector",
        abort={"tokens": LONG, "steps": 2},
        held={"tokens": HELD},
        batches=[_batch([prompt(12, 40)])],
        max_num_batched_tokens=2 * CHUNK,
    )
    return before, _stats(vllm_daemon), out


def test_aborted_request_mid_save_leaves_nothing(
    aborted_and_held, vllm_daemon: Daemon, tiny_model: str
) -> None:  # type: ignore[no-untyped-def]
    before, after, out = aborted_and_held
    assert out["open_saves"] == 1  # the reservation was open (chunks copied) when the request was aborted
    assert after.active_leases == 0
    assert after.expired_leases == before.expired_leases  # dropped by the connector, not at the TTL
    ns = _identity(tiny_model).namespace()
    with TierCacheClient.connect(vllm_daemon.address) as client:
        assert client.lookup(ns, chunk_keys(ns, LONG)).chunks == 0


def test_blocks_held_while_save_in_flight(aborted_and_held, vllm_daemon: Daemon, tiny_model: str) -> None:  # type: ignore[no-untyped-def]
    """vLLM keeps a finished request's blocks until the connector reports its save done; then it is visible."""
    before, after, out = aborted_and_held
    held = out["held"]
    assert held["idle_before"]  # the aborted request's blocks were back before this request came
    assert held["finished"]  # the request finished (its output token was returned) ...
    assert held["held_blocks"] == 5  # ... and its 5 blocks stayed allocated: the save was in flight
    assert held["held_after_steps"] == 1 and held["held_blocks_after_steps"] == 5  # steps did not report it
    assert held["visible_in_flight"] == 0  # nothing visible before the commit
    assert held["committed"] and held["released"]
    assert held["free_after"] == held["free_before"]  # reported once committed: vLLM freed the blocks
    assert held["visible_after"] == 4  # every full chunk, published at once
    assert held["tickets_closed"] == [True]  # the ticket was committed, not left to lapse
    assert after.active_leases == 0 and after.expired_leases == before.expired_leases
    ns = _identity(tiny_model).namespace()
    with TierCacheClient.connect(vllm_daemon.address) as client:
        assert client.lookup(ns, chunk_keys(ns, HELD)).chunks == 4


def test_default_multiprocess_engine_loads(run_vllm: RunVllm, vllm_daemon: Daemon) -> None:
    p = [prompt(13, 4 * CHUNK + 8)]
    run_vllm(extra=extra(vllm_daemon.address), batches=[_batch(p)])
    plain = run_vllm(extra=None, batches=[_batch(p)])
    multi = run_vllm(extra=extra(vllm_daemon.address), batches=[_batch(p)], multiprocess=True)
    assert _cached(multi) == [4 * CHUNK]
    assert _tokens(multi) == _tokens(plain)
    assert _stats(vllm_daemon).active_leases == 0  # leased in EngineCore, released by the Worker process


def _stats(daemon: Daemon):  # type: ignore[no-untyped-def]
    with TierCacheClient.connect(daemon.address) as client:
        return client.stats()


def _identity(model: str) -> EngineIdentity:
    layout = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=CHUNK, page_tokens=CHUNK)
    return EngineIdentity(model, "", BackendLayout.CPU, layout)

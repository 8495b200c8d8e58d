"""tiercache's tiers in vLLM's own KV events, and tiercache's counters in vLLM's metrics: one real vLLM engine
(CPU, tiny Llama, KV events over ZMQ) on a real daemon; this test subscribes to the engine's ZMQ publisher
and decodes the stream with vLLM's own event classes.

* A prompt another vLLM engine of the same namespace stored before this engine started is published as
  ``BlockStored`` (``medium="CPU"``) with vLLM's own hashes once this engine sees the prompt.
* A prompt the engine served without storing it (``tiercache_skip_save``) and that another engine of the
  same namespace then stored (this test's own client, a second writer through the daemon) is published as
  ``BlockStored`` with ``medium="CPU"`` (L2), ``ownership="tiercache"``, with the block hashes and token ids
  vLLM itself published for that prompt's blocks (its ``GPU`` events); a purge of the namespace is
  published as the matching ``BlockRemoved``.
* A prompt the engine stored itself is published as stored in L2 (CPU) and, written down, in L3 (STORAGE).
* After a hit, vLLM's metrics carry tiercache's counters (tokens loaded per tier, lookups, saves).
* The README's subscriber example prints tiercache's events from the engine's publisher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

import msgspec
import zmq
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from tests.connector.conftest import connector_daemon
from tests.connector.vllm.conftest import CHUNK, HERE, extra, prompt, run_engine
from tiercache.connector import TierCacheClient
from tiercache.connector.vllm.layout import BackendLayout
from tiercache.connector.vllm.namespace import EngineIdentity
from tiercache.connector.vllm.stats import FIELDS
from tiercache.keys import chunk_keys
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.daemon import DaemonProcess, free_port
from tiercache.testing.engine import EngineProcess
from tiercache.testing.waits import wait_until

ENGINE = HERE / "events_engine.py"
START_S = 600.0
WAIT_S = 120.0
FILLER = prompt(9, 8)  # shorter than a block: steps the engine, adds no block event
OTHER = prompt(51, 3 * CHUNK + 5)  # served with tiercache_skip_save, then stored by another engine
OWN = prompt(52, 2 * CHUNK + 7)  # stored by the engine itself
EARLIER = prompt(54, 2 * CHUNK + 9)  # stored by another vLLM engine before this module's engine started


class Subscriber:
    """A ZMQ SUB socket on vLLM's publisher, decoding every batch with vLLM's ``KVEventBatch``."""

    def __init__(self, port: int) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 200)
        self._sock.connect(f"tcp://127.0.0.1:{port}")
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._lock = threading.Lock()
        self.events: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                _topic, seq, payload = self._sock.recv_multipart()
            except zmq.Again:
                continue
            assert len(seq) == 8
            batch = self._decoder.decode(payload)
            with self._lock:
                self.events.extend(batch.events)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._sock.close(linger=0)
        self._ctx.term()


class Engine:
    """The engine process, one command at a time."""

    def __init__(self, proc: EngineProcess, port: int) -> None:
        self.proc = proc
        self.port = port  # its KV events publisher's

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        self.proc.tell(json.dumps({"op": op, **args}))
        return self.proc.message(WAIT_S)

    def generate(
        self, *prompts: list[int], skip_save: bool = False, skip_load: bool = False, max_tokens: int = 2
    ) -> list[int]:
        batch = [{"tokens": t, "skip_save": skip_save, "skip_load": skip_load} for t in prompts]
        return list(self.ask("generate", prompts=batch, max_tokens=max_tokens)["cached"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("events-daemon")
    d = connector_daemon(root, ["--write-policy", "write_through"])  # L3's events come right after a store
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def setup(
    tiny_model: str, daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Subscriber]]:
    # Another vLLM engine of the same namespace stores EARLIER first (one engine at a time on this host).
    earlier = run_engine(
        tiny_model,
        tmp_path_factory.mktemp("earlier"),
        extra=extra(daemon.address),
        batches=[[{"tokens": EARLIER}]],
    )
    assert earlier["batches"][0][0]["cached"] == 0
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERCACHE_", "VLLM_"))}
    params = {"model": tiny_model, "extra": extra(daemon.address), "events_port": port}
    proc = EngineProcess([sys.executable, str(ENGINE)], params, env=env, cwd=tmp_path_factory.mktemp("eng"))
    sub: Subscriber | None = None
    try:
        assert proc.message(START_S).get("ready"), proc.stderr()[-3000:]
        sub = Subscriber(port)
        engine = Engine(proc, port)
        warm = prompt(8, CHUNK)  # one full block: vLLM publishes it (ZMQ's subscriber joins late)
        for _ in range(50):
            if sub.snapshot():
                break
            engine.generate(warm)
            warm = [t + 1 for t in warm]
        assert sub.snapshot(), "no KV event batch reached the subscriber"
        yield engine, sub
    finally:
        if sub is not None:
            sub.close()
        proc.close()


def _ours(events: list[Any], kind: type, medium: str) -> list[Any]:
    return [e for e in events if isinstance(e, kind) and e.medium == medium and e.ownership == "tiercache"]


def _await(engine: Engine, sub: Subscriber, found: Any, what: str) -> list[Any]:
    """Step the engine (vLLM publishes a connector's events at its steps) until ``found(events)``."""
    for _ in range(200):
        events = sub.snapshot()
        if found(events):
            return events
        engine.generate(FILLER, max_tokens=1)
    raise AssertionError(f"{what}: not in the {len(sub.snapshot())} events published")


def _hashes(events: list[Any]) -> list[Any]:
    return [h for e in events for h in e.block_hashes]


def _vllm_blocks(events: list[Any], tokens: list[int]) -> list[tuple[Any, list[int]]]:
    """vLLM's own GPU events for the full blocks of ``tokens``: (hash, block tokens) in prompt order."""
    blocks: dict[Any, list[int]] = {}
    for e in events:
        if isinstance(e, BlockStored) and e.medium == "GPU":
            per = len(e.token_ids) // len(e.block_hashes)
            for i, h in enumerate(e.block_hashes):
                blocks[h] = list(e.token_ids[i * per : (i + 1) * per])
    wanted = [tokens[i : i + CHUNK] for i in range(0, len(tokens) // CHUNK * CHUNK, CHUNK)]
    found = [(h, toks) for h, toks in blocks.items() if toks in wanted]
    found.sort(key=lambda b: wanted.index(b[1]))
    return found


def _published(sub: Subscriber, tokens: list[int], blocks: int) -> list[tuple[Any, list[int]]]:
    """vLLM's own GPU events for ``blocks`` full blocks of ``tokens``, once they arrived: EngineCore's publisher
    thread sends them after the step, so they can reach the subscriber after the request's answer (on a loaded
    host CI saw none yet right after it)."""
    wait_until(
        lambda: len(_vllm_blocks(sub.snapshot(), tokens)) >= blocks, WAIT_S, "vLLM's own BlockStored events"
    )
    return _vllm_blocks(sub.snapshot(), tokens)


def test_a_store_of_another_vllm_engine_before_this_one_started_is_reported(
    setup: tuple[Engine, Subscriber],
) -> None:
    """The feed replays what the daemon retained when the engine subscribes; the chunks are named once the
    engine sees the prompt (computed here: ``tiercache_skip_load``, so that vLLM publishes its own hashes)."""
    engine, sub = setup
    assert engine.generate(EARLIER, skip_load=True) == [0]
    gpu = [h for h, _ in _published(sub, EARLIER, 2)]
    assert len(gpu) == 2
    events = _await(
        engine,
        sub,
        lambda ev: set(gpu) <= set(_hashes(_ours(ev, BlockStored, "CPU"))),
        "BlockStored(CPU) for the chunks another vLLM engine stored earlier",
    )
    stored = [e for e in _ours(events, BlockStored, "CPU") if set(e.block_hashes) <= set(gpu)]
    assert _hashes(stored) == gpu and [e.token_ids for e in stored] == [
        EARLIER[:CHUNK],
        EARLIER[CHUNK : 2 * CHUNK],
    ]


def test_another_engines_store_and_purge_reach_vllm_events(
    setup: tuple[Engine, Subscriber], tiny_model: str, daemon: DaemonProcess
) -> None:
    engine, sub = setup
    assert engine.generate(OTHER, skip_save=True) == [0]
    gpu = _published(sub, OTHER, 3)
    assert [toks for _, toks in gpu] == [OTHER[i * CHUNK : (i + 1) * CHUNK] for i in range(3)]
    wanted = [h for h, _ in gpu]
    tiercache_hashes = set(_hashes(_ours(sub.snapshot(), BlockStored, "CPU")))
    assert not tiercache_hashes & set(wanted), "not in tiercache yet: the engine did not store it"

    # Another engine of the same namespace stores the prompt's three chunks.
    layout = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=CHUNK, page_tokens=CHUNK)
    ns = EngineIdentity(tiny_model, "", BackendLayout.CPU, layout).namespace()
    with TierCacheClient.connect(daemon.address) as client:
        grant = client.begin_store(ns, chunk_keys(ns, OTHER[: 3 * CHUNK]))
        assert client.commit_store(ns, grant.ticket_id) == 3

        events = _await(
            engine,
            sub,
            lambda ev: set(wanted) <= set(_hashes(_ours(ev, BlockStored, "CPU"))),
            "BlockStored(CPU) for the chunks another engine stored",
        )
        stored = [e for e in _ours(events, BlockStored, "CPU") if set(e.block_hashes) <= set(wanted)]
        assert _hashes(stored) == wanted  # one event per chunk, in chain order
        for event, (_, toks) in zip(stored, gpu, strict=True):
            assert event.token_ids == toks and event.block_size == CHUNK and event.locality == "LOCAL"
        assert stored[0].parent_block_hash is None
        assert [e.parent_block_hash for e in stored[1:]] == wanted[:-1]

        assert client.purge(ns) >= 3
    _await(
        engine,
        sub,
        lambda ev: set(wanted) <= set(_hashes(_ours(ev, BlockRemoved, "CPU"))),
        "BlockRemoved(CPU) after the purge",
    )


def test_own_store_reaches_vllm_events_per_tier(setup: tuple[Engine, Subscriber]) -> None:
    engine, sub = setup
    engine.generate(OWN)
    wanted = [h for h, _ in _published(sub, OWN, 2)]
    assert len(wanted) == 2
    for medium in ("CPU", "STORAGE"):  # L2, and L3 once written down
        _await(
            engine,
            sub,
            lambda ev, m=medium: set(wanted) <= set(_hashes(_ours(ev, BlockStored, m))),
            f"BlockStored({medium}) for the engine's own store",
        )


def _forget(engine: Engine) -> None:
    """Empty vLLM's own prefix cache (it holds a finished request's blocks until its save is committed, and
    learns of the commit at a step)."""
    for _ in range(200):
        if engine.ask("reset_prefix_cache")["reset"]:
            return
        engine.generate(FILLER, max_tokens=1)
    raise AssertionError("vLLM's prefix cache could not be reset")


def test_vllm_metrics_carry_tiercache_counters_after_a_hit(setup: tuple[Engine, Subscriber]) -> None:
    engine, _ = setup
    doc = prompt(53, 4 * CHUNK + 3)
    assert engine.generate(doc) == [0]  # computed, and stored by the connector
    before = engine.ask("metrics")["metrics"]
    cached = 0
    for _ in range(50):  # the save is committed in the background: the first tries may miss
        _forget(engine)
        cached = engine.generate(doc)[0]
        if cached:
            break
    assert cached == 4 * CHUNK
    after = engine.ask("metrics")["metrics"]

    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    exported = {name.split("{")[0] for name in after}
    assert {f"vllm:tiercache_{field}" for field in FIELDS} <= exported  # every counter, on vLLM's registry
    assert moved("vllm:tiercache_loaded_tokens{tier=L2}") == 4 * CHUNK
    assert moved("vllm:external_prefix_cache_hits") == 4 * CHUNK  # vLLM's own count of the same hit
    assert (
        moved("vllm:tiercache_lookups") + moved("vllm:tiercache_index_answers") >= 1
    )  # a call, or the index
    assert moved("vllm:tiercache_lookup_hit_tokens") >= 4 * CHUNK
    assert moved("vllm:tiercache_load_seconds") > 0
    assert after["vllm:tiercache_saved_tokens"] >= 4 * CHUNK
    assert after["vllm:tiercache_save_seconds"] > 0
    assert after["vllm:tiercache_lookup_misses"] >= 1  # the first, computed request of each prompt


def test_the_subscriber_example_prints_tiercache_events(setup: tuple[Engine, Subscriber]) -> None:
    """``connector/examples/kv_events_subscriber.py`` (what the README shows a router receiving) on the
    engine's publisher: it prints a BlockStored of tiercache's once the engine stores a prompt."""
    engine, _ = setup
    example = HERE.parents[2] / "connector" / "examples" / "kv_events_subscriber.py"
    argv = [
        sys.executable,
        str(example),
        f"tcp://127.0.0.1:{engine.port}",
        "--count",
        "10",  # the first of tiercache's events may be a removal or an L3 store left by earlier tests
        "--timeout",
        "120",
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        # New prompts until the subscriber (it starts slower than the engine serves a prompt, and ZMQ drops
        # what is published before it joins) has seen a store.
        for seed in range(100, 10_000):
            if proc.poll() is not None:
                break
            engine.generate(prompt(seed, CHUNK + 3), max_tokens=1)
        out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err[-3000:]
    assert "BlockStored medium=CPU locality=LOCAL ownership=tiercache" in out, out

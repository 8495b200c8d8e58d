"""A lightweight engine process for the fault runs: ``python -m tiercache.testing.faults.engine``, spoken to
with the line protocol of :mod:`tiercache.testing.engine` (its parameters on stdin, messages on stdout).

It talks to the daemon through the real connector (shared-memory data plane). Modes (``mode`` in the
parameters):

- ``hold``: lease the cached prefix of a prompt, say ``{"ready": ...}``, then hang (until killed);
- ``ticket``: begin a store of a prompt, fill half of its slots, say so, hang (never commits);
- ``claim``: claim a prompt's prefill as leader with ``ttl_s``, say so, hang (never publishes);
- ``save``: begin a layerwise save of a prompt, save its first layer only, say so, hang;
- ``soak``: connect and warm up (one store and one load), say ``{"ready": "soak"}``; then for each
  ``go`` line on stdin store and load random prompts shared by every engine for ``duration_s``, checking
  every load bit for bit, and say that phase's summary; exit on any other line (or the end of stdin).
  Between phases the run measures the daemon with every engine connected.

Primitives:
    SoakSummary: what a soak engine did.
    soak: the soak loop of one connector (also usable in-process).
    main: run one mode from its parameters.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tiercache.connector import KVConnector
from tiercache.keys import chunk_keys

from ..engine import next_line, read_params, say
from .workload import LAYOUT, connect, load_and_check, prompt_kv, prompt_tokens, store_prompt


@dataclass(frozen=True, slots=True)
class SoakSummary:
    """What one soak engine did.

    Attributes:
        requests: stores and loads issued.
        stores / loads: of those, each kind.
        errors: calls that raised (the connector itself never raises on daemon trouble: a store of 0
            tokens or a load of 0 tokens of a prompt known to be stored counts here too).
        wrong_loads: loads that put a wrong byte into the tensors.
        tokens_loaded: tokens loaded in all.
    """

    requests: int
    stores: int
    loads: int
    errors: int
    wrong_loads: int
    tokens_loaded: int


def soak(conn: KVConnector, engine: int, duration_s: float, prompts: int, chunks: int) -> SoakSummary:
    """Store and load random prompts for ``duration_s``; every load is checked against the source KV.

    The engine draws from ``prompts`` prompts shared by every engine (same numbers, so engines load what
    others stored) and mixes stores and loads one to two.
    """
    rng = random.Random(engine)
    requests = stores = loads = errors = wrong = loaded = 0
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        prompt = rng.randrange(prompts)
        requests += 1
        try:
            if rng.random() < 1 / 3:
                stores += 1
                if store_prompt(conn, prompt, chunks) == 0:
                    errors += 1
            else:
                loads += 1
                check = load_and_check(conn, prompt, chunks)
                wrong += not check.exact
                loaded += check.tokens_loaded
        except Exception:
            errors += 1
    return SoakSummary(requests, stores, loads, errors, wrong, loaded)


def _soak_mode(p: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    conn = connect(p["address"], timeout_s=30.0)
    try:
        warm = p["engine"] % p["prompts"]
        store_prompt(conn, warm, p["chunks"])
        load_and_check(conn, warm, p["chunks"])
        say({"ready": "soak"})
        while next_line() == "go":  # one phase per "go"; anything else (or EOF): exit
            phase = soak(conn, p["engine"], p["duration_s"], p["prompts"], p["chunks"])
            say(asdict(phase))
    finally:
        conn.client.close()


def _hang() -> None:
    """Wait until killed (the fault runs SIGKILL this process)."""
    signal.pause()


def main(p: dict[str, Any]) -> dict[str, Any]:
    """Run one mode; returns the JSON-able outcome (the holding modes never return)."""
    mode, prompt, chunks = p["mode"], p.get("prompt", 0), p.get("chunks", 4)
    if mode == "soak":
        _soak_mode(p)
        raise SystemExit(0)
    conn = connect(p["address"])
    tokens = prompt_tokens(prompt, chunks)
    keys = chunk_keys(conn.namespace, tokens)
    if mode == "hold":
        lease = conn.client.acquire_load(conn.namespace, keys)
        ready: dict[str, Any] = {"ready": mode, "chunks": len(lease.slots)}
    elif mode == "ticket":
        grant = conn.client.begin_store(conn.namespace, keys)
        mapping = conn.client.slot_mapping(conn.namespace)
        assert mapping is not None, "no shared-memory data plane"
        raw = prompt_kv(prompt, chunks).layers[0].view(torch.uint8).flatten()
        with mapping.use() as access:
            for ref in grant.slots[: max(1, len(grant.slots) // 2)]:  # half written, never committed
                access.view(ref).copy_(raw[: ref.nbytes])
        ready = {"ready": mode, "chunks": len(grant.slots), "ticket_id": grant.ticket_id}
    elif mode == "claim":
        claim = conn.prefill_claim(tokens, ttl_s=p["ttl_s"])
        ready = {"ready": mode, "leader": claim.leader, "lead_tokens": claim.lead_tokens}
    elif mode == "save":
        save = conn.begin_save(tokens)
        save.save_layer(0, prompt_kv(prompt, chunks))  # one layer of LAYOUT.num_layers, never committed
        ready = {"ready": mode, "open": save.open, "layers": LAYOUT.num_layers}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    say(ready)
    _hang()
    return ready


if __name__ == "__main__":
    main(read_params())

"""Corrupted L3 values: bit flips, truncations and values swapped between keys, injected with py-lmdb while
the daemon is stopped, then read by a restarted daemon. Every one must be detected and be a counted miss.

A daemon stores prompts until L3 holds every chunk, and stops. The run opens the L3 environment itself
and damages one chunk of each chosen prompt: flips a byte (of the header or the payload), cuts the value
short, or swaps the values of two prompts' chunks (each value is intact, only under the other key). A new
daemon on that L3 is then asked for every prompt: a load may stop before the damaged chunk, never serve a
wrong byte; the L3 ``corrupt_reads`` counter must count each damaged chunk.

Primitives:
    CorruptConfig: how many prompts and injections, the daemon and the work directory.
    CorruptReport: injected, detected (counted), wrong loads, by kind.
    run_corruption: run it; the report.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from tiercache.keys import chunk_keys, split_chunk_id
from tiercache.tiers.base import TierLevel
from tiercache.tiers.lmdb_env import VALUES_DB

from ..embedded import EmbeddedDaemonConfig, daemon_process
from .kill import chunks_in_l3, default_daemon
from .workload import LAYOUT, connect, load_and_check, prompt_tokens, store_prompt

logger = logging.getLogger(__name__)

KINDS = ("bitflip", "truncate", "swap")
"""The injected damage, in the order they are dealt out."""
_SETTLE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class CorruptConfig:
    """What a corruption run does.

    Attributes:
        work_dir: an existing directory the run owns.
        prompts: prompts stored (each is damaged at most once; swaps take two).
        injections: damaged chunks (at most ``prompts``).
        chunks: chunks per prompt.
        seed: where the damage goes.
        daemon: the daemons' sizes.
    """

    work_dir: Path
    prompts: int = 16
    injections: int = 12
    chunks: int = 4
    seed: int = 0
    daemon: EmbeddedDaemonConfig = field(default_factory=default_daemon)


@dataclass(frozen=True, slots=True)
class CorruptReport:
    """Figures of a corruption run.

    Attributes:
        injected: damaged chunks.
        detected: chunks the restarted daemon counted as corrupt (``corrupt_reads`` of L3).
        wrong_loads: loads that put a wrong byte into the engine's tensors (must be 0).
        served_damaged: damaged chunks a load still returned (must be 0).
        by_kind: injected chunks per kind.
    """

    injected: int
    detected: int
    wrong_loads: int
    served_damaged: int
    by_kind: dict[str, int]


def _damage(env: lmdb.Environment, victims: list[tuple[bytes, str]], partners: dict[bytes, bytes]) -> None:
    """Apply the damage in one write transaction (``partners``: swap pairs, both ways)."""
    rng = random.Random(len(victims))
    db = env.open_db(VALUES_DB)
    with env.begin(write=True, db=db) as txn:
        originals = {cid: txn.get(cid) or b"" for cid, _ in victims}
        for cid, kind in victims:
            value = bytearray(originals[cid])
            if kind == "bitflip":
                at = rng.randrange(len(value))
                value[at] ^= 1 << rng.randrange(8)
            elif kind == "truncate":
                del value[rng.randrange(1, len(value)) :]
            else:
                value = bytearray(originals[partners[cid]])
            txn.put(cid, bytes(value))


def run_corruption(config: CorruptConfig) -> CorruptReport:
    """Store, stop, damage L3 with py-lmdb, restart and read everything; the figures."""
    l3_dir = config.work_dir / "l3"
    sock_dir = Path(tempfile.mkdtemp(prefix="tcfault-"))
    prompts = list(range(config.prompts))  # distinct families: no chunk is shared between two prompts
    rng = random.Random(config.seed)
    try:
        daemon = daemon_process(config.daemon, config.work_dir, l3_dir, sock_dir / "d.sock", "faults")
        daemon.start()
        conn = connect(daemon.address)
        try:
            for p in prompts:
                store_prompt(conn, p, config.chunks)
            want = len(prompts) * config.chunks
            deadline = time.monotonic() + _SETTLE_TIMEOUT_S
            while len(chunks_in_l3(conn, prompts, config.chunks)) < want:  # write-downs still running
                if time.monotonic() > deadline:
                    raise RuntimeError(f"L3 never held all {want} chunks")
                threading.Event().wait(0.05)
            keys = {p: chunk_keys(conn.namespace, prompt_tokens(p, config.chunks)) for p in prompts}
        finally:
            conn.client.close()
            daemon.cleanup()

        chosen = rng.sample(prompts, min(config.injections, len(prompts)))
        at = {p: rng.randrange(config.chunks) for p in chosen}
        kinds = {p: KINDS[i % len(KINDS)] for i, p in enumerate(chosen)}
        swaps = [p for p in chosen if kinds[p] == "swap"]
        if len(swaps) % 2:
            kinds[swaps.pop()] = "bitflip"
        env = lmdb.open(str(l3_dir), max_dbs=3, subdir=True)
        try:
            by_suffix = _ids_by_key(env)
            cid = {p: by_suffix[keys[p][at[p]]] for p in chosen}
            partners = {}
            for a, b in zip(swaps[0::2], swaps[1::2], strict=True):
                partners[cid[a]], partners[cid[b]] = cid[b], cid[a]
            _damage(env, [(cid[p], kinds[p]) for p in chosen], partners)
        finally:
            env.close()

        daemon = daemon_process(config.daemon, config.work_dir, l3_dir, sock_dir / "d.sock", "faults")
        daemon.start()
        conn = connect(daemon.address)
        try:
            wrong = served = 0
            for p in prompts:
                check = load_and_check(conn, p, config.chunks)
                wrong += not check.exact
                if p in at and check.tokens_loaded > at[p] * LAYOUT.chunk_tokens:
                    served += 1
            l3 = conn.client.stats().tier(TierLevel.L3)
        finally:
            conn.client.close()
            daemon.cleanup()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    by_kind = {k: sum(1 for p in chosen if kinds[p] == k) for k in KINDS}
    logger.info("corruption: %d injected %s, %d counted corrupt", len(chosen), by_kind, l3.corrupt_reads)
    return CorruptReport(len(chosen), l3.corrupt_reads, wrong, served, by_kind)


def _ids_by_key(env: lmdb.Environment) -> dict[bytes, bytes]:
    """Stored chunk ids by their chunk key (the id is the namespace id followed by the key)."""
    db = env.open_db(VALUES_DB)
    with env.begin(db=db) as txn:
        ids = [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]
    return {split_chunk_id(cid)[1]: cid for cid in ids}

"""Where a ``workload`` trace is replayed: the core cache in this process, or a daemon via the connector.

Each request is served the way an engine would: look the prompt's chunk chain up (counted), load the
cached prefix the load policy chooses into engine memory (under ``wait_complete`` in rounds when L2 cannot
hold the whole prefix at once, as the connector does), verify every loaded byte against what was
stored for that chunk (a mismatch raises :class:`~tiercache.bench.common.tier_ops.RoundTripError`), report what the
load was worth, then store the full chunks that were computed. A chunk's bytes are a pure function of its
key (seeded random bytes), so any load can be checked without remembering what was stored.

Primitives:
    CacheSizes: the tier capacities of one replay.
    ReplayOptions: layout, policies, prefetch, verification.
    RequestOutcome: token counts and times of one request.
    TierCounters: one tier's counters after a replay.
    ReplayTarget: the protocol both targets follow.
    InprocTarget: a :class:`~tiercache.cache.manager.CacheManager` over fresh tiers in this process.
    DaemonTarget: a daemon through :class:`~tiercache.connector.KVConnector` (shared memory).
    chunk_payload: the bytes of a chunk, from its key.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from tiercache.cache import CacheBuildConfig, CacheConfig, LoadChunk, LoadTicket, build_cache
from tiercache.connector import (
    ClientConfig,
    ContiguousKV,
    KVConnector,
    TierCacheClient,
    chunk_to_kv,
    kv_to_chunk,
)
from tiercache.errors import CapacityError
from tiercache.keys import Namespace, chunk_keys
from tiercache.layout import KVLayout
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.policies.load import LoadPolicyKind, PrefillModel, make_load_policy
from tiercache.stats import TierStats
from tiercache.testing.embedded import DaemonHandle
from tiercache.tiers.base import TierLevel
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig

from ..common.tier_ops import RoundTripError


@dataclass(frozen=True, slots=True)
class CacheSizes:
    """Tier capacities of one replay (0: the tier is absent; L2 is always present).

    Attributes:
        l1_bytes: L1 capacity.
        l2_bytes: L2 capacity.
        l3_bytes: L3 capacity.
    """

    l1_bytes: int
    l2_bytes: int
    l3_bytes: int


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How requests are served.

    Attributes:
        layout: KV layout (its ``chunk_bytes`` is the slot size).
        write_policy: when chunks are written down.
        eviction_policy: which chunk goes first.
        load_policy: how much of the cached prefix to load.
        timeout_s: the ``timeout`` load policy's wait.
        prefetch: start promoting the cached prefix at lookup.
        prefill_tokens_per_s: the engine's declared prefill rate (cost-aware loads; prefill saved).
        l1_device: device of an in-process L1.
        verify: compare every loaded chunk with its source.
    """

    layout: KVLayout
    write_policy: WritePolicyKind = WritePolicyKind.WRITE_THROUGH
    eviction_policy: EvictionPolicyKind = EvictionPolicyKind.ADAPTIVE
    load_policy: LoadPolicyKind = LoadPolicyKind.WAIT_COMPLETE
    timeout_s: float = 0.05
    prefetch: bool = False
    prefill_tokens_per_s: float = 10_000.0
    l1_device: str = "cpu"
    verify: bool = True


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What one request got, in tokens, and how long the cache calls took.

    Attributes:
        looked_up: tokens in the prompt's full chunks.
        hit: tokens of the cached prefix the lookup found.
        loaded: tokens loaded intact into engine memory (the engine skips their prefill).
        stored: tokens of chunks the cache added.
        load_s: time of lookup + load (+ verification is excluded).
        store_s: time of the store.
        verified_bytes: bytes compared with their source.
    """

    looked_up: int
    hit: int
    loaded: int
    stored: int
    load_s: float
    store_s: float
    verified_bytes: int


@dataclass(frozen=True, slots=True)
class TierCounters:
    """One tier's counters over a replay.

    Attributes:
        level: the tier.
        capacity_bytes: its capacity.
        lookup_hit_tokens: looked-up tokens whose fastest copy was here.
        load_success_tokens: tokens loaded into the engine from here.
        effective_hit_tokens: prefill tokens skipped thanks to chunks from here (None: not reported).
        evictions: chunks evicted for room.
        promotions: chunks copied in from a slower tier.
        demotions: chunks copied in from a faster tier.
        loaded_bytes: bytes loaded into the engine from here.
        promoted_bytes: bytes copied in by promotions.
        demoted_bytes: bytes copied in by demotions (write-downs).
        stored_bytes: bytes of new chunks that landed here.
    """

    level: TierLevel
    capacity_bytes: int
    lookup_hit_tokens: int
    load_success_tokens: int
    effective_hit_tokens: int | None
    evictions: int
    promotions: int
    demotions: int
    loaded_bytes: int
    promoted_bytes: int
    demoted_bytes: int
    stored_bytes: int


class ReplayTarget(Protocol):
    """A cache that serves requests."""

    def serve(self, tokens: np.ndarray) -> RequestOutcome:
        """Serve one request (lookup, load and verify, report, store)."""
        ...

    def counters(self) -> tuple[TierCounters, ...]:
        """Per-tier counters since the target was opened."""
        ...

    def close(self) -> None:
        """Release everything the target holds."""
        ...


_BLOCK_BYTES = 8192


def chunk_payload(key: bytes, nbytes: int) -> torch.Tensor:
    """The bytes stored for chunk ``key``: an 8 KiB block of random bytes seeded by the key, repeated.

    A pure function of the key (so any load can be checked), distinct per chunk and cheap to make.
    """
    block = np.random.default_rng(int.from_bytes(key[:8], "little")).bytes(_BLOCK_BYTES)
    reps = -(-nbytes // _BLOCK_BYTES)
    return torch.from_numpy(np.frombuffer(block * reps, dtype=np.uint8)[:nbytes].copy())


def _check(got: torch.Tensor, key: bytes, index: int) -> int:
    want = chunk_payload(key, got.numel())
    if not torch.equal(got.cpu(), want):
        first = int(torch.nonzero(got.cpu() != want)[0, 0])
        raise RoundTripError(
            f"chunk {index} ({key.hex()[:16]}) loaded other bytes than stored, first at byte {first}"
        )
    return got.numel()


def _namespace(layout: KVLayout) -> Namespace:
    return Namespace("tiercache-bench/workload", f"run-{secrets.token_hex(4)}", layout)


class InprocTarget:
    """The core cache manager over fresh tiers, in this process."""

    def __init__(self, options: ReplayOptions, sizes: CacheSizes, work_dir: Path) -> None:
        """Build the tiers (L3 in ``work_dir``) and the manager.

        Raises:
            TierCacheError: a tier refused its configuration.
        """
        self._options = options
        layout = options.layout
        nbytes = layout.chunk_bytes
        prefix = f"tiercache-bench-wl-{secrets.token_hex(4)}"
        path = work_dir / f"l3-{secrets.token_hex(4)}"
        build = CacheBuildConfig(
            cache=CacheConfig(write_policy=options.write_policy, eviction_policy=options.eviction_policy),
            l1=HbmTierConfig(sizes.l1_bytes, nbytes, options.l1_device) if sizes.l1_bytes else None,
            l2=HostTierConfig(sizes.l2_bytes, nbytes, prefix, pin=False),
            l3=LmdbTierConfig(path=str(path), capacity_bytes=sizes.l3_bytes) if sizes.l3_bytes else None,
        )
        self._manager = build_cache(build)
        self._ns = _namespace(layout)
        self._ns_id = self._manager.register_namespace(self._ns)
        self._policy = make_load_policy(
            options.load_policy,
            timeout_s=options.timeout_s,
            prefill=PrefillModel(options.prefill_tokens_per_s),
        )
        self._stored_chunks = dict.fromkeys(self._manager.levels, 0)

    def _acquire(self, keys: Sequence[bytes]) -> LoadTicket | None:
        """Lease what the load policy takes of the cached prefix ``keys`` (None: nothing to lease)."""
        if not keys:
            return None
        choice = self._policy.choose(
            keys, lambda ks, prefill: self._manager.plan_load(self._ns_id, ks, prefill)
        )
        if not choice.keys:
            return None
        prompt_tokens = len(keys) * self._options.layout.chunk_tokens
        return self._manager.acquire(self._ns_id, choice.keys, wait_s=self._policy.wait_s(prompt_tokens))

    def serve(self, tokens: np.ndarray) -> RequestOutcome:
        """Serve one request; see the module docstring.

        Raises:
            RoundTripError: a loaded chunk differs from what was stored.
        """
        m, layout = self._manager, self._options.layout
        c = layout.chunk_tokens
        keys = chunk_keys(self._ns, tokens)
        t0 = time.perf_counter()
        info = m.lookup(self._ns_id, keys, count=True)
        if self._options.prefetch and info.chunks:
            m.prefetch(self._ns_id, keys[: info.chunks])
        verified = 0
        by_source: dict[TierLevel, int] = {}
        chunks: list[LoadChunk] = []
        copies = []
        while len(chunks) < info.chunks:  # in rounds, like the connector, when L2 cannot hold it all at once
            done = len(chunks)
            ticket = self._acquire(keys[done : info.chunks])
            part = ticket.chunks if ticket is not None else ()
            try:
                for ch in part:
                    copies.append(ch.view.to("cpu", copy=True))
                    by_source[ch.source] = by_source.get(ch.source, 0) + c
            finally:
                if ticket is not None and ticket.lease_id:
                    m.release(ticket.lease_id)
            chunks.extend(replace(ch, index=done + ch.index) for ch in part)
            if not part or self._options.load_policy is not LoadPolicyKind.WAIT_COMPLETE:
                break
        load_s = time.perf_counter() - t0
        if self._options.verify:
            verified = sum(_check(buf, ch.key, ch.index) for buf, ch in zip(copies, chunks, strict=True))
        loaded = len(chunks) * c
        m.report_usage(self._ns_id, by_source, info.chunks * c - loaded, by_source)
        t1 = time.perf_counter()
        stored = self._store(keys)
        return RequestOutcome(
            len(keys) * c, info.chunks * c, loaded, stored * c, load_s, time.perf_counter() - t1, verified
        )

    def _store(self, keys: Sequence[bytes]) -> int:
        m = self._manager
        try:
            ticket = m.begin_store(self._ns_id, keys)
        except CapacityError:
            return 0
        try:
            for slot in ticket.slots:
                slot.buffer.copy_(chunk_payload(slot.key, self._options.layout.chunk_bytes))
        except BaseException:
            m.abort_store(ticket.ticket_id)
            raise
        stored = m.commit_store(ticket.ticket_id)
        self._stored_chunks[ticket.level] += stored
        return stored

    def counters(self) -> tuple[TierCounters, ...]:
        """Per-tier counters (after waiting for queued write-downs)."""
        self._manager.flush()
        nbytes, c = self._options.layout.chunk_bytes, self._options.layout.chunk_tokens
        return tuple(
            TierCounters(
                level=t.level,
                capacity_bytes=t.capacity_bytes,
                lookup_hit_tokens=t.lookup_hit_tokens,
                load_success_tokens=t.load_success_tokens,
                effective_hit_tokens=t.effective_hit_tokens,
                evictions=t.evictions,
                promotions=t.promotions,
                demotions=t.demotions,
                loaded_bytes=t.load_success_tokens // c * nbytes,
                promoted_bytes=t.promotions * nbytes,
                demoted_bytes=t.demotions * nbytes,
                stored_bytes=self._stored_chunks[t.level] * nbytes,
            )
            for t in self._manager.stats().tiers
        )

    def close(self) -> None:
        """Close the manager (and its tiers: L2 unlinks its segment)."""
        self._manager.close()


class DaemonTarget:
    """A daemon, through the connector's same-host data plane (``wait_complete`` loads)."""

    def __init__(self, options: ReplayOptions, handle: DaemonHandle, max_tokens: int) -> None:
        """Connect, register a fresh namespace and allocate engine KV for ``max_tokens`` tokens.

        Raises:
            ValueError: a load policy other than ``wait_complete`` (the connector's load uses that one).
            TierCacheError: the daemon refused the namespace.
        """
        if options.load_policy is not LoadPolicyKind.WAIT_COMPLETE:
            raise ValueError(
                f"load policy {options.load_policy.value}: through a daemon the bench loads with the "
                "connector's KVConnector.load (wait_complete); use --inproc to compare load policies"
            )
        self._options = options
        layout = options.layout
        self._ns = _namespace(layout)
        self._client = TierCacheClient.connect(
            handle.address, handle.token, config=ClientConfig(timeout_s=60.0)
        )
        self._conn = KVConnector(self._client, self._ns)
        self._client.register(self._ns)
        shape = (2, max(max_tokens, layout.chunk_tokens), layout.num_kv_heads, layout.head_dim)
        dtype = layout.dtype.torch_dtype
        self._src = ContiguousKV([torch.zeros(shape, dtype=dtype) for _ in range(layout.num_layers)])
        self._dst = ContiguousKV([torch.zeros(shape, dtype=dtype) for _ in range(layout.num_layers)])
        self._staging = torch.empty(layout.chunk_bytes, dtype=torch.uint8)
        self._stored = 0
        self._before = self._tier_stats()

    def _tier_stats(self) -> Mapping[TierLevel, TierStats]:
        """The daemon's per-tier stats now (the core's schema, as the in-process target reads them)."""
        return {t.level: t for t in self._client.stats().tiers}

    def serve(self, tokens: np.ndarray) -> RequestOutcome:
        """Serve one request; see the module docstring.

        Raises:
            RoundTripError: a loaded chunk differs from what was stored.
        """
        layout, c = self._options.layout, self._options.layout.chunk_tokens
        keys = chunk_keys(self._ns, tokens)
        n = len(keys) * c
        for t in self._dst.layers:
            t[:, :n].zero_()
        t0 = time.perf_counter()
        hit = self._conn.lookup(tokens, prefetch=self._options.prefetch)
        loaded = self._conn.load(tokens, self._dst).tokens_loaded if hit else 0
        load_s = time.perf_counter() - t0
        verified = 0
        if self._options.verify:
            for i in range(loaded // c):
                kv_to_chunk(layout, self._dst, i, self._staging)
                verified += _check(self._staging, keys[i], i)
        for i in range(loaded // c, len(keys)):
            chunk_to_kv(layout, chunk_payload(keys[i], layout.chunk_bytes), self._src, i)
        t1 = time.perf_counter()
        stored = self._conn.store(tokens, self._src).tokens_stored if n else 0
        self._stored += stored // c
        return RequestOutcome(n, hit, loaded, stored, load_s, time.perf_counter() - t1, verified)

    def counters(self) -> tuple[TierCounters, ...]:
        """Per-tier counters: the daemon's, less their values when the target was opened."""
        nbytes, c = self._options.layout.chunk_bytes, self._options.layout.chunk_tokens
        after = self._tier_stats()
        out = []
        for level, a in after.items():
            b = self._before.get(level, a)

            def d(name: str, a: TierStats = a, b: TierStats = b) -> int:
                return int(getattr(a, name)) - int(getattr(b, name))

            out.append(
                TierCounters(
                    level=level,
                    capacity_bytes=a.capacity_bytes,
                    lookup_hit_tokens=d("lookup_hit_tokens"),
                    load_success_tokens=d("load_success_tokens"),
                    effective_hit_tokens=None,
                    evictions=d("evictions"),
                    promotions=d("promotions"),
                    demotions=d("demotions"),
                    loaded_bytes=d("load_success_tokens") // c * nbytes,
                    promoted_bytes=d("promotions") * nbytes,
                    demoted_bytes=d("demotions") * nbytes,
                    stored_bytes=self._stored * nbytes if level is TierLevel.L2 else 0,
                )
            )
        return tuple(sorted(out, key=lambda t: t.level))

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

"""The same-host data plane: copies straight between the daemon's shared-memory slots and the engine's KV.

A load leases the slots of the cached prefix (AcquireLoad), copies each chunk from its slot into the
engine's tensors and releases the lease. A prefix that shared memory cannot hold at once (longer than L2, or
L2 full of other engines' leases) is loaded in rounds under ``wait_complete``: the rest of the chain is
leased again once the first part is copied, while each round makes progress. Its bytes count as loaded only
if the lease provably covered the copy: the copy finished before the lease's expiry by the local clock (the
release then rides on the namespace's next call: one round trip per load), or the daemon confirmed a waited
release. Otherwise the slots may have been reused and the load reports 0 tokens.
A store reserves slots (BeginStore), fills them and commits, or aborts on any failure so that no partial
chunk is ever visible.

Slots are always viewed through the mapping of the *current* registration's segment: a control call may
just have re-registered after a daemon restart, and the slots it names are in the new segment.

Primitives:
    SharedMemoryPlane: the :class:`~.dataplane.DataPlane` over shared-memory slots.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType

import torch

from tiercache.errors import TierCacheError, UnavailableError
from tiercache.keys import Namespace
from tiercache.policies.load import LoadPolicyKind
from tiercache.tiers.base import TierLevel

from .checked_copy import kv_to_slots_checked
from .client import TierCacheClient
from .config import ConnectorConfig
from .dataplane import DataPlane, Medium, PrefillPublisher
from .kv import EngineKV, kv_to_chunk, kv_to_run, run_to_kv
from .layerwise import LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult
from .policy import WirePolicy
from .results import LoadLease, SlotRef, StoreGrant
from .segments import SlotMapping

logger = logging.getLogger(__name__)


def _prefix(refs: Sequence[SlotRef]) -> list[SlotRef]:
    """The slots of positions 0, 1, 2, ... in order, up to the first gap."""
    by_index = {r.index: r for r in refs}
    out: list[SlotRef] = []
    while len(out) in by_index:
        out.append(by_index[len(out)])
    return out


@dataclass(frozen=True, slots=True)
class _Round:
    """A load so far: its result, and whether every chunk leased arrived (another round may follow)."""

    result: LoadResult
    complete: bool

    def joined(self, later: _Round) -> _Round:
        """This load followed by a round over the rest of the chain (its result counts from depth 0)."""
        a, b = self.result, later.result
        sources = dict(a.sources)
        for level, tokens in b.sources.items():
            sources[level] = sources.get(level, 0) + tokens
        result = replace(
            a,
            tokens_hit=a.tokens_hit + b.tokens_hit,
            tokens_loaded=a.tokens_loaded + b.tokens_loaded,
            sources=MappingProxyType(sources),
        )
        return _Round(result, later.complete)


class SharedMemoryPlane(DataPlane):
    """Loads and stores through the daemon's shared-memory slots (the daemon runs on this host)."""

    kind = Medium.SHARED_MEMORY

    def __init__(
        self,
        client: TierCacheClient,
        namespace: Namespace,
        config: ConnectorConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, namespace, config, clock)
        self._layout = namespace.layout
        # Copies half of each large run's layers (kv.SPLIT_MIN_BYTES) while the caller copies the rest. Its
        # idle thread ends with the plane (the executor's finalizer) or at interpreter exit.
        self._helper = (
            ThreadPoolExecutor(1, thread_name_prefix="tiercache-hostcopy")
            if (os.cpu_count() or 1) > 1
            else None
        )

    # ------------------------------------------------------------------ load

    def load(self, keys: Sequence[bytes], kv: EngineKV, policy: WirePolicy, prompt_tokens: int) -> LoadResult:
        result = self._load_round(keys, kv, policy, prompt_tokens, 0)
        c_tokens = self._layout.chunk_tokens
        done = result.result.tokens_loaded // c_tokens
        cached = result.result.tokens_cached // c_tokens
        # WAIT_COMPLETE leases the whole cached prefix unless shared memory cannot hold it at once (a prefix
        # larger than L2, or L2 full of other leases): the rest follows in further rounds, each leased once
        # the previous one is copied (its release rides on the next AcquireLoad), while each makes progress.
        while policy.kind is LoadPolicyKind.WAIT_COMPLETE and 0 < done < cached and result.complete:
            part = self._load_round(keys[done:], kv, policy, prompt_tokens, done)
            result = result.joined(part)
            if part.result.tokens_loaded == 0:
                break
            done += part.result.tokens_loaded // c_tokens
        return result.result

    def _load_round(
        self, keys: Sequence[bytes], kv: EngineKV, policy: WirePolicy, prompt_tokens: int, offset: int
    ) -> _Round:
        """One lease of the cached prefix of ``keys`` (chain positions ``offset, offset + 1, ...``), copied
        into ``kv`` and released."""
        looked_up = (offset + len(keys)) * self._layout.chunk_tokens
        started = self.clock()
        lease = self._acquire(keys, policy, prompt_tokens)
        refs = self._checked(_prefix(lease.slots))
        planned = self._planned(lease, refs, looked_up)
        if lease.lease_id == 0:
            return _Round(planned, len(refs) == len(lease.slots))
        copied = 0
        in_time = False
        try:
            with self.mapping().use() as slots:
                for first, run in slots.runs(refs):
                    run_to_kv(self._layout, run, kv, offset + first, helper=self._helper)
                    copied += run.shape[0]
            # The lease's TTL started at the daemon after ``started``: by the local clock it held throughout.
            in_time = self.clock() < started + lease.expires_in_s
        finally:
            released = self._release(lease, wait=not in_time)
        if released is False or (released is None and not in_time):
            logger.warning("load lease %d lapsed during the copy; recomputing", lease.lease_id)
            copied = 0
        if copied < len(refs):
            failed = LoadResult(looked_up, planned.tokens_hit, 0, tokens_cached=planned.tokens_cached)
            return _Round(failed, False)
        return _Round(planned, len(refs) == len(lease.slots))

    def load_layerwise(
        self,
        keys: Sequence[bytes],
        kv: EngineKV,
        policy: WirePolicy,
        prompt_tokens: int,
        on_result: Callable[[LoadResult], None],
    ) -> LayerwiseLoad:
        looked_up = len(keys) * self._layout.chunk_tokens
        started = self.clock()
        lease = self._acquire(keys, policy, prompt_tokens)
        refs = self._checked(_prefix(lease.slots))
        planned = self._planned(lease, refs, looked_up)
        if lease.lease_id == 0 or not refs:
            if lease.lease_id:
                self._release(lease)
            return LayerwiseLoad.unleased(self._layout, kv, planned, on_result)
        deadline = started + lease.expires_in_s

        @contextmanager
        def buffers() -> Iterator[list[tuple[int, torch.Tensor]]]:
            with self.mapping().use() as slots:
                yield [(ref.index, slots.view(ref)) for ref in refs]

        return LayerwiseLoad(
            self._layout,
            kv,
            buffers(),
            planned,
            valid=lambda: self.clock() < deadline,  # per layer, so the release needs no answer: deferred
            release=lambda: self._release(lease, wait=False),
            on_result=on_result,
        )

    # ------------------------------------------------------------------ store

    def store(self, keys: Sequence[bytes], kv: EngineKV) -> StoreResult:
        c_tokens = self._layout.chunk_tokens
        offered = len(keys) * c_tokens
        grant = self.client.begin_store(self.namespace, keys, ttl_s=self.config.store_ttl_s)
        committed = False
        try:
            with self.mapping().use() as slots:
                for ref in grant.slots:
                    if ref.nbytes != self._layout.chunk_bytes or not 0 <= ref.index < len(keys):
                        raise TierCacheError(
                            f"store slot for chunk {ref.index} holds {ref.nbytes} bytes,"
                            f" expected {self._layout.chunk_bytes}"
                        )
                sums = kv_to_slots_checked(self._layout, kv, grant.slots, slots.view, self._helper)
                if sums is None:  # not contiguous CPU memory: copied as before, hashed by the daemon
                    for first, run in slots.runs(sorted(grant.slots, key=lambda r: r.index)):
                        kv_to_run(self._layout, kv, first, run, helper=self._helper)
            stored = self.client.commit_store(self.namespace, grant.ticket_id, None, sums)
            committed = True
        finally:
            if not committed:
                self._abort(grant)
        return StoreResult(offered, stored * c_tokens, len(grant.skipped) * c_tokens)

    def begin_save(self, keys: Sequence[bytes], cached: int | None = None) -> LayerwiseSave:
        layout = self._layout
        start = cached or 0
        grant = self.client.begin_store(
            self.namespace, keys[start:], ttl_s=self.config.store_ttl_s, start_depth=start
        )
        bad = [
            r for r in grant.slots if r.nbytes != layout.chunk_bytes or not 0 <= r.index < len(keys) - start
        ]
        if bad or not grant.slots:
            if bad:
                logger.warning(
                    "store slot for chunk %d holds %d bytes; not caching", start + bad[0].index, bad[0].nbytes
                )
            self._abort(grant)
            return LayerwiseSave.empty(layout, len(keys), start + len(grant.skipped), remote=False)

        @contextmanager
        def buffers() -> Iterator[list[tuple[int, torch.Tensor]]]:
            with self.mapping().use() as slots:
                yield [(start + ref.index, slots.view(ref)) for ref in grant.slots]

        return LayerwiseSave(
            layout,
            len(keys),
            buffers(),
            commit=lambda: self.client.commit_store(self.namespace, grant.ticket_id),
            abort=lambda: self._abort(grant),
            skipped_chunks=start + len(grant.skipped),
            remote=False,
        )

    def prefill_publisher(self, keys: Sequence[bytes], start: int) -> PrefillPublisher:
        return _SlotPublisher(self, keys, start)

    # ------------------------------------------------------------------ internals

    def mapping(self) -> SlotMapping:
        """The segment of the current registration (a call may just have re-registered after a restart)."""
        mapping = self.client.slot_mapping(self.namespace)
        if mapping is None:
            raise UnavailableError("data plane: the daemon's shared memory is no longer reachable")
        return mapping

    def _acquire(self, keys: Sequence[bytes], policy: WirePolicy, prompt_tokens: int) -> LoadLease:
        return self.client.acquire_load(
            self.namespace,
            keys,
            ttl_s=self.config.load_ttl_s,
            policy=policy.kind,
            timeout_s=policy.timeout_s,
            prompt_tokens=prompt_tokens,
        )

    def _checked(self, refs: list[SlotRef]) -> list[SlotRef]:
        """The prefix of ``refs`` whose slots hold a whole chunk."""
        for i, ref in enumerate(refs):
            if ref.nbytes != self._layout.chunk_bytes:
                logger.warning(
                    "slot of chunk %d holds %d bytes, expected %d",
                    ref.index,
                    ref.nbytes,
                    self._layout.chunk_bytes,
                )
                return refs[:i]
        return refs

    def _planned(self, lease: LoadLease, refs: list[SlotRef], looked_up: int) -> LoadResult:
        """The result of a load once every chunk of ``refs`` has arrived."""
        c_tokens = self._layout.chunk_tokens
        sources: dict[TierLevel, int] = {}
        for ref in refs:
            if ref.source is not None:
                sources[ref.source] = sources.get(ref.source, 0) + c_tokens
        return LoadResult(
            looked_up,
            len(_prefix(lease.slots)) * c_tokens,
            len(refs) * c_tokens,
            tokens_cached=lease.cached * c_tokens,
            sources=MappingProxyType(sources),
            estimated_load_s=lease.estimated_load_s,
            estimated_recompute_s=lease.estimated_recompute_s,
        )

    def _release(self, lease: LoadLease, wait: bool = True) -> bool | None:
        """Release a lease; None when not waited for (deferred to the namespace's next call, see
        :meth:`~.client.TierCacheClient.defer_release`), or when the daemon could not answer (it then
        expires at its TTL)."""
        try:
            if not wait:
                self.client.defer_release(self.namespace, lease.lease_id)
                return None
            return self.client.release_load(self.namespace, lease.lease_id)
        except TierCacheError as exc:
            logger.warning("releasing load lease %d failed (%s); it expires at its TTL", lease.lease_id, exc)
            return None

    def _abort(self, grant: StoreGrant) -> None:
        try:
            self.client.abort_store(self.namespace, grant.ticket_id)
        except TierCacheError as exc:
            logger.warning(
                "aborting store ticket %d failed (%s); it expires at its TTL", grant.ticket_id, exc
            )


class _SlotPublisher(PrefillPublisher):
    """Publishes led chunks through one store grant for ``keys[start:]``, committed position by position."""

    def __init__(self, plane: SharedMemoryPlane, keys: Sequence[bytes], start: int) -> None:
        self._plane = plane
        self._keys = keys
        self._start = start
        self._grant: StoreGrant | None = None
        self._slots: dict[int, SlotRef] = {}
        self._published: set[int] = set()

    @property
    def reserved(self) -> bool:
        return self._grant is not None

    def publish(self, kv: EngineKV, positions: Sequence[int]) -> int:
        plane, layout = self._plane, self._plane.namespace.layout
        if self._grant is None:
            self._grant = plane.client.begin_store(
                plane.namespace,
                self._keys[self._start :],
                start_depth=self._start,
                ttl_s=plane.config.store_ttl_s,
            )
            self._slots = {self._start + ref.index: ref for ref in self._grant.slots}
        refs = [self._slots[p] for p in positions if p in self._slots]
        if refs:
            with plane.mapping().use() as slots:
                for p in positions:
                    if p in self._slots:
                        kv_to_chunk(layout, kv, p, slots.view(self._slots[p]))
            plane.client.commit_store(
                plane.namespace, self._grant.ticket_id, indices=[ref.index for ref in refs]
            )
        self._published.update(positions)  # positions without a slot were cached or stored by someone else
        return len(refs)

    def abort(self) -> None:
        grant, self._grant = self._grant, None
        if grant is not None and any(p not in self._published for p in self._slots):
            try:
                self._plane.client.abort_store(self._plane.namespace, grant.ticket_id)
            except TierCacheError as exc:
                logger.warning("aborting prefill store ticket failed (%s); it expires at its TTL", exc)

"""The worker's loads: one step's load specs turned into the connector's transfers into vLLM's blocks.

Each request's blocks are a :class:`~tiercache.connector.kv.PagedKV` over the registered caches (written from
the first block vLLM did not compute). From leased shared-memory slots (:class:`LeasedLoad`) the copy is a
:class:`~tiercache.connector.layerwise.LayerwiseLoad`: layer by layer; on CUDA in a background thread on a
side stream with one event per layer, so that the copy of layer l + 1 overlaps the model's compute of layer
l; into a CPU cache at once, in the caller (``start_load_kv``, before the forward pass: the model's compute
already keeps every core busy, so a copy thread would only compete with it). After the last layer the lease
is released (:func:`release_lease`): when the local clock proves it held for the whole copy, without
waiting (the release rides on the namespace's next AcquireLoad or BeginStore, or goes one-way shortly after:
:meth:`~tiercache.connector.client.TierCacheClient.defer_release`); otherwise with a waited release, and a
lease the daemon does not confirm may have had its slots reused, so the load fails and its blocks are
reported as load errors (vLLM recomputes them), as for a failed copy.

Over the byte stream (:func:`receive_into`: no lease, the daemon's StreamLoad leases while it sends) each
chunk is copied into its blocks as soon as it is whole, before ``start_load_kv`` returns (on CUDA queued on
the engine's stream, ahead of the forward pass); the blocks of chunks that did not arrive whole are load
errors.

Either way the worker knows which tokens it wrote and from which tier each chunk came (the lease's
``SlotRef.source``, the stream's ``StreamChunk.source``): :func:`tokens_by_tier` counts the blocks written,
which is what vLLM skips (its ``num_external_computed_tokens``), for the worker's usage report.

Primitives:
    published_lease: chunks found in the published index, shaped as a lease (with no lease behind it).
    leased_prefix: the slots of a lease that hold whole consecutive chunks, in order.
    LeasedLoad: one request's lease, slots and target blocks; ``start`` -> its LayerwiseLoad.
    release_lease: release a lease after its copy; False when it may not have held.
    receive_into: a request's chunks over the byte stream into its blocks; the block ids that failed and
        the tokens written per source tier.
    tokens_by_tier: the tokens of a run of blocks, by the source tier of the chunk each block is in.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tiercache.errors import TierCacheError
from tiercache.keys import Namespace
from tiercache.layout import KVLayout
from tiercache.tiers.base import TierLevel
from tiercache.tiers.published import Published

from ..client import TierCacheClient
from ..kv import PagedKV, chunk_to_kv
from ..layerwise import LayerwiseLoad
from ..outcomes import LoadResult
from ..results import LoadLease, SlotRef, StreamChunk
from ..segments import SlotMapping
from ..stream_plane import ByteStreamPlane

logger = logging.getLogger(__name__)


def tokens_by_tier(
    sources: Sequence[TierLevel | None], layout: KVLayout, first_block: int, end_block: int
) -> dict[TierLevel, int]:
    """The tokens of blocks ``first_block .. end_block - 1`` of a request, by the source tier of the chunk
    each block belongs to (``sources[i]``: chunk ``i``'s; a chunk of unknown source is left out)."""
    per = layout.chunk_tokens // layout.page_tokens
    tokens: dict[TierLevel, int] = {}
    for block in range(first_block, end_block):
        source = sources[block // per] if block // per < len(sources) else None
        if source is not None:
            tokens[source] = tokens.get(source, 0) + layout.page_tokens
    return tokens


def published_lease(first: int, found: Sequence[Published]) -> LoadLease:
    """The chunks found in a pool's published index from chunk position ``first`` on, shaped as a lease
    with no lease behind it (id 0: nothing to release; the copy is checked against the index instead)."""
    refs = (SlotRef(first + i, p.slot, p.nbytes, TierLevel.L2) for i, p in enumerate(found))
    return LoadLease(0, tuple(refs), 0.0)


def leased_prefix(lease: LoadLease, chunk_bytes: int) -> tuple[SlotRef, ...]:
    """The slots of ``lease`` holding chunks ``first, first + 1, ...`` whole, from its lowest chunk position
    ``first`` (0, or where the scheduler asked from); a chunk missing or short ends the run."""
    by_index = {r.index: r for r in lease.slots}
    position = min(by_index, default=0)
    refs: list[SlotRef] = []
    while position in by_index and by_index[position].nbytes == chunk_bytes:
        refs.append(by_index[position])
        position += 1
    return tuple(refs)


@dataclass(frozen=True, slots=True)
class LeasedLoad:
    """One request's load under a lease.

    Attributes:
        namespace: the request's namespace.
        lease: the daemon's lease (its slots hold the chunks of ``refs``).
        refs: the leased slots to copy, in chunk order.
        mapping: the shared-memory segment the slots are in.
        block_ids: the request's blocks covering the loaded chunks.
        first_block: blocks before this one are not written (vLLM computed them).
        started: local clock when the lease was asked for (its TTL started after this).
        check: for chunks found in the pool's published index (no lease: ``lease.lease_id`` is 0), whether
            each entry is unchanged after the copy (False: the chunk was dropped or moved meanwhile; the
            load fails and its blocks are load errors); None: the lease proves the copy.
        read_keys: those chunks' keys (reported to the daemon once copied: each a read of its L2 copy).
    """

    namespace: Namespace
    lease: LoadLease
    refs: tuple[SlotRef, ...]
    mapping: SlotMapping
    block_ids: tuple[int, ...]
    first_block: int
    started: float
    check: Callable[[], bool] | None = None
    read_keys: tuple[bytes, ...] = ()

    def target_blocks(self) -> set[int]:
        """The blocks this load writes."""
        return set(self.block_ids[self.first_block :])

    def loaded_by_tier(self, layout: KVLayout) -> dict[TierLevel, int]:
        """The tokens this load writes (once it succeeded), by the tier each chunk came from."""
        first = self.refs[0].index if self.refs else 0  # the lease starts at the first chunk vLLM lacks
        sources: list[TierLevel | None] = [None] * first
        sources.extend(ref.source for ref in self.refs)
        return tokens_by_tier(sources, layout, self.first_block, len(self.block_ids))

    def start(
        self,
        client: TierCacheClient,
        layout: KVLayout,
        caches: Sequence[torch.Tensor],
        clock: Callable[[], float],
    ) -> LayerwiseLoad:
        """Start copying the leased chunks into the request's blocks (into a CPU cache: done on return)."""
        kv = PagedKV.of_blocks(caches, self.block_ids, self.first_block)

        @contextmanager
        def buffers() -> Iterator[list[tuple[int, torch.Tensor]]]:
            # Inside ``use``: a retired mapping is unmapped only when its last user leaves.
            with self.mapping.use() as slots:
                yield [(ref.index, slots.view(ref)) for ref in self.refs]

        tokens = len(self.refs) * layout.chunk_tokens
        planned = LoadResult(tokens, tokens, tokens, remote=False, tokens_cached=tokens)
        return LayerwiseLoad(
            layout,
            kv,
            buffers(),
            planned,
            valid=lambda: True,  # proven once, at the release (by the clock, the daemon or the index)
            release=self.check or (lambda: release_lease(client, self, clock)),
            on_result=lambda _result: None,
            inline=True,
        )


def release_lease(client: TierCacheClient, load: LeasedLoad, clock: Callable[[], float]) -> bool:
    """Release ``load``'s lease after its copy; False when neither the clock nor the daemon proves it held."""
    if clock() < load.started + load.lease.expires_in_s:
        # The local clock proves the lease held (its TTL started after ``started``): no answer is needed, the
        # release rides on the namespace's next call (or goes one-way shortly).
        client.defer_release(load.namespace, load.lease.lease_id)
        return True
    try:
        covered = client.release_load(load.namespace, load.lease.lease_id)
    except TierCacheError as exc:
        logger.warning("releasing load lease %d failed (%s)", load.lease.lease_id, exc)
        covered = False  # neither the clock nor the daemon can prove the lease held
    if not covered:
        logger.warning("load lease %d lapsed during the copy; vLLM recomputes", load.lease.lease_id)
    return covered


def receive_into(
    plane: ByteStreamPlane,
    keys: Sequence[bytes],
    caches: Sequence[torch.Tensor],
    block_ids: Sequence[int],
    first_block: int,
) -> tuple[set[int], dict[TierLevel, int]]:
    """Receive the cached prefix of ``keys`` over the byte stream into a request's blocks (from
    ``first_block`` on); returns the target blocks that did not get their KV (vLLM recomputes them) and
    the tokens written, by the tier each chunk came from."""
    layout = plane.namespace.layout
    per = layout.chunk_tokens // layout.page_tokens
    kv = PagedKV.of_blocks(caches, block_ids, first_block)
    on_cpu = caches[0].device.type == "cpu"
    sources: list[TierLevel | None] = []

    def consume(chunk: StreamChunk) -> None:
        with warnings.catch_warnings():  # a lent message is read-only: torch warns that it could write
            warnings.simplefilter("ignore", UserWarning)
            buf = torch.frombuffer(chunk.data, dtype=torch.uint8)
        chunk_to_kv(layout, buf, kv, chunk.index, non_blocking=not on_cpu)
        sources.append(chunk.source)

    got = 0
    try:
        # Into a CPU cache each copy is done when ``consume`` returns: one assembly buffer serves all.
        got = plane.receive(keys, consume, reuse_buffer=on_cpu, lend=True)
    except TierCacheError as exc:
        logger.warning("tiercache stream load failed (%s); vLLM recomputes its blocks", exc)
    except Exception:
        logger.exception("tiercache stream load failed; vLLM recomputes its blocks")
    end = max(min(got * per, len(block_ids)), first_block)
    return set(block_ids[end:]), tokens_by_tier(sources[:got], layout, first_block, end)

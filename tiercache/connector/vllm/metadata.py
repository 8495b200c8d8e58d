"""What the scheduler-side connector hands the worker-side connector each step (pickled between processes).

The scheduler knows the prompts and the block tables; the worker owns the KV tensors and moves the bytes.
Each step's :class:`TierCacheMetadata` says which blocks to load from which chunks, which newly computed
full chunks to copy into a store reservation, when to commit it, and which requests lost their blocks to a
preemption (the worker finishes their copies before the forward pass and drops their reservations).

Primitives:
    LoadSpec: one request's load (its prefix tokens, the blocks they land in, the blocks vLLM computed, and
        the lease the scheduler took for it, if any).
    SaveSpec: one request's save work in this step (the chunks completed now, commit or not).
    TierCacheMetadata: the step's loads, saves and preempted saving requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from tiercache.tiers.published import Published

from ..results import LoadLease


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Load the cached chunks of a request's prefix into its blocks.

    Attributes:
        req_id: the request.
        adapter: its LoRA adapter name ("" for the base model).
        cache_salt: its cache salt ("").
        tokens: the prompt tokens of the chunks to load (whole chunks).
        block_ids: the request's blocks to fill, in order (the last chunk's may be only its first blocks).
        first_block: blocks before this one hold KV vLLM computed or cached itself: not overwritten.
        lease: the lease the scheduler took when it looked the request up (TP = PP = 1; its slots numbered
            by chunk position in the prompt, from the first chunk vLLM did not have): the worker copies
            from its slots and releases it; None: the worker leases the chunks itself.
        leased_at: the scheduler's ``time.monotonic()`` just before it asked for ``lease`` (the lease's TTL
            started after it; the clock is the host's, shared by the engine's processes).
        published: instead of a lease, the chunks the scheduler found in the pool's published index
            (:mod:`tiercache.tiers.published`), from the first chunk vLLM did not have: the worker copies
            them and then checks that each entry is unchanged.
        segment: the segment whose index they were found in (a worker that maps another one loads none).
    """

    req_id: str
    adapter: str
    cache_salt: str
    tokens: tuple[int, ...]
    block_ids: tuple[int, ...]
    first_block: int
    lease: LoadLease | None = None
    leased_at: float = 0.0
    published: tuple[Published, ...] = ()
    segment: str = ""


@dataclass(frozen=True, slots=True)
class SaveSpec:
    """A request's save work in one step.

    The first spec of a request carries ``tokens`` (the reservation is made then, for chunk positions
    ``start_chunk`` up to the prompt's last full chunk); later specs carry only the positions to copy.

    Attributes:
        req_id: the request.
        adapter: its LoRA adapter name.
        cache_salt: its cache salt.
        tokens: the prompt's full-chunk tokens (only in the first spec of the request; else empty).
        start_chunk: the first chunk position to store (the chunks before are cached already).
        chunks: chunk positions whose KV is complete after this step's forward pass, to copy now.
        block_ids: the request's blocks (from block 0) covering at least ``chunks``.
        commit: publish the reservation after this step (every chunk has been copied).
    """

    req_id: str
    adapter: str
    cache_salt: str
    tokens: tuple[int, ...]
    start_chunk: int
    chunks: tuple[int, ...]
    block_ids: tuple[int, ...]
    commit: bool


@dataclass
class TierCacheMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the worker-side connector.

    Attributes:
        loads: requests whose cached prefix is loaded before this forward pass.
        saves: requests with chunks to copy (and maybe commit) in this forward pass.
        preempted: requests with save work that were preempted since the last step (vLLM freed their
            blocks): the worker waits for their copies before this forward pass and drops their reservation.
    """

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

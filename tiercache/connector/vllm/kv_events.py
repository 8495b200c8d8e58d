"""tiercache's tiers in vLLM's own KV events: what prefix-aware routers (llm-d, Dynamo) read.

vLLM publishes ``BlockStored`` / ``BlockRemoved`` events for the blocks of its own cache when it runs with
``--kv-events-config``; a connector adds its own through ``take_events`` (scheduler side, once per engine
step). :class:`KVEventsBridge` adds tiercache's: every chunk of this engine's namespaces that the daemon
stores in or drops from a tier — stored by this engine or by any other engine of the same namespace on the
daemon — becomes a ``BlockStored`` / ``BlockRemoved`` for the chunk's vLLM blocks, with vLLM's own block
hashes, parent hash, token ids, LoRA and extra keys (from vLLM's functions, as its block pool fills them),
and per tier (:data:`TIER_MEDIA`): L2 ``medium="CPU"``, L3 ``STORAGE``, the shared tier ``STORAGE`` with
``locality="REMOTE"``; ``ownership="tiercache"``.

How chunks become blocks: the daemon sees keys, never token ids, so its event feed (:mod:`..watch`) names
chunk keys. The bridge keeps a bounded catalog (``max_chunks``: the ``kv_events_chunks`` option; least
recently noted out first) of the chunks of every prompt this engine's scheduler was asked about (:meth:`KVEventsBridge.note`): key -> the chunk's
vLLM blocks. A chunk the feed names is reported once the catalog knows it — at once when it does, or when a
request with that prefix arrives later (the feed's residency is remembered by key for the same bound). A
chunk of a prompt this engine never saw cannot be named in vLLM's terms and is not reported. A chunk
forgotten by the bounded catalog while reported is reported removed (a router then under-estimates, never
over-estimates); so is everything when the feed says events were missed (RESYNC), until the feed reports
the chunks again.

Not reported: L1 (tiercache's own device pool) — its ``GPU`` medium would be confused with vLLM's own GPU
blocks by routers that key on medium. With TP or PP > 1 the scheduler's keys are rank 0's: a chunk is
reported by where rank 0's shard is.

Primitives:
    TIER_MEDIA: (medium, locality) per tier.
    OWNERSHIP: the ``ownership`` every event carries.
    ChunkBlocks: one chunk's vLLM blocks (hashes, parent, token ids, LoRA, extra keys).
    chunk_blocks: a vLLM request's full chunks as ChunkBlocks.
    KVEventsBridge: ``note(request)``, ``on_event`` (the feed's callback), ``take_events``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    maybe_convert_block_hash,
    to_event_extra_keys,
)

from tiercache.keys import chunk_keys
from tiercache.tiers.base import TierLevel

from ..watch import WatchedEvent, WatchedKind
from .config import DEFAULT_KV_EVENTS_CHUNKS
from .namespace import EngineIdentity, request_factors

logger = logging.getLogger(__name__)

TIER_MEDIA: dict[TierLevel, tuple[str, str]] = {
    TierLevel.L2: (MEDIUM_CPU, "LOCAL"),
    TierLevel.L3: (MEDIUM_STORAGE, "LOCAL"),
    TierLevel.SHARED: (MEDIUM_STORAGE, "REMOTE"),
}
"""vLLM ``medium`` and ``locality`` of the tiers reported (L1 is not: see the module docstring)."""
OWNERSHIP = "tiercache"
"""The ``ownership`` ("secondary offloading tier identifier") of every event the bridge makes."""


@dataclass(frozen=True, slots=True)
class ChunkBlocks:
    """One chunk's blocks as vLLM names them.

    Attributes:
        block_hashes: vLLM's hashes of the chunk's blocks, in order (its ``BlockHash`` bytes: converted as
            its events carry them when an event is made, which is rarer than a chunk being noted).
        parent_block_hash: the hash of the block before the chunk (None for the prompt's first chunk).
        token_ids: the chunk's tokens.
        block_size: tokens per block.
        lora_id, lora_name: the request's LoRA adapter (None for the base model).
        extra_keys: per block, what vLLM's hash mixed in besides tokens (cache salt, LoRA), or None.
    """

    block_hashes: tuple[Any, ...]
    parent_block_hash: Any
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None

    def _hashes(self) -> list[Any]:
        return [maybe_convert_block_hash(h) for h in self.block_hashes]

    def stored(self, tier: TierLevel) -> BlockStored:
        """vLLM's event for the chunk stored in ``tier``."""
        medium, locality = TIER_MEDIA[tier]
        parent = self.parent_block_hash
        return BlockStored(
            block_hashes=self._hashes(),
            parent_block_hash=maybe_convert_block_hash(parent) if parent is not None else None,
            token_ids=list(self.token_ids),
            block_size=self.block_size,
            lora_id=self.lora_id,
            medium=medium,
            lora_name=self.lora_name,
            extra_keys=list(self.extra_keys) if self.extra_keys is not None else None,
            group_idx=0,
            locality=locality,
            ownership=OWNERSHIP,
        )

    def removed(self, tier: TierLevel) -> BlockRemoved:
        """vLLM's event for the chunk dropped from ``tier``."""
        medium, locality = TIER_MEDIA[tier]
        return BlockRemoved(
            block_hashes=self._hashes(),
            medium=medium,
            group_idx=0,
            locality=locality,
            ownership=OWNERSHIP,
        )


def chunk_blocks(request: Any, chunk_tokens: int, block_size: int) -> list[ChunkBlocks]:
    """The full chunks of a vLLM ``Request``'s prompt as vLLM's blocks (empty when vLLM hashed no blocks:
    prefix caching off)."""
    prompt = list(request.prompt_token_ids or ())
    hashes = list(getattr(request, "block_hashes", ()) or ())
    per = chunk_tokens // block_size
    full = min(len(prompt) // chunk_tokens, len(hashes) // per)
    lora = getattr(request, "lora_request", None)
    lora_id = int(lora.adapter_id) if lora is not None else None
    lora_name = str(lora.name) if lora is not None else None
    chunks: list[ChunkBlocks] = []
    mm_index = 0
    for i in range(full):
        extra: list[tuple[Any, ...] | None] = []
        for b in range(i * per, (i + 1) * per):
            keys, mm_index = generate_block_hash_extra_keys(
                request, b * block_size, (b + 1) * block_size, mm_index
            )
            extra.append(keys)
        event_keys = to_event_extra_keys(extra)
        first = i * per
        chunks.append(
            ChunkBlocks(
                block_hashes=tuple(hashes[first : first + per]),
                parent_block_hash=hashes[first - 1] if first else None,
                token_ids=tuple(prompt[i * chunk_tokens : (i + 1) * chunk_tokens]),
                block_size=block_size,
                lora_id=lora_id,
                lora_name=lora_name,
                extra_keys=tuple(event_keys) if event_keys is not None else None,
            )
        )
    return chunks


@dataclass(slots=True)
class _Entry:
    """What the bridge knows of one chunk key."""

    handle: bytes = b""  # the namespace's handle, from the feed
    blocks: ChunkBlocks | None = None
    tiers: set[TierLevel] = field(default_factory=set)  # where the daemon holds it (by its feed)
    published: set[TierLevel] = field(default_factory=set)  # where the events handed to vLLM say it is

    def shown(self) -> set[TierLevel]:
        """The tiers vLLM's events should say it is in."""
        return {t for t in self.tiers if t in TIER_MEDIA} if self.blocks is not None else set()


class KVEventsBridge:
    """tiercache's tiers as vLLM KV events (see the module docstring). Thread-safe: ``on_event`` runs on the
    feed's thread, ``note`` and ``take_events`` on vLLM's scheduler thread.

    Changes are kept as the chunks they touch, not as events, until vLLM takes them: what is pending stays
    bounded by the catalog while the engine does not step, and a chunk stored and dropped between two steps
    makes no event at all.
    """

    def __init__(
        self,
        identity: EngineIdentity,
        max_chunks: int = DEFAULT_KV_EVENTS_CHUNKS,
    ) -> None:
        """Args:
        identity: the engine (its chunk and block sizes, its namespaces).
        max_chunks: the catalog's bound (chunks).
        """
        self._identity = identity
        self._max = max_chunks
        self._chunk = identity.layout.chunk_tokens
        self._block = identity.layout.page_tokens
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._changed: dict[bytes, None] = {}  # keys whose events are due, in the order they changed
        self._forgotten: list[tuple[ChunkBlocks, frozenset[TierLevel]]] = []  # published, then trimmed

    # ------------------------------------------------------------------ vLLM's side

    def note(self, request: Any) -> None:
        """Learn the chunks of a request's prompt (reporting those the daemon already holds)."""
        if len(request.prompt_token_ids or ()) < self._chunk:
            return
        blocks = chunk_blocks(request, self._chunk, self._block)
        if not blocks:
            return
        ns = self._identity.namespace(*request_factors(request))
        keys = chunk_keys(ns, list(request.prompt_token_ids)[: len(blocks) * self._chunk])
        with self._lock:
            for key, chunk in zip(keys, blocks, strict=True):
                entry = self._entry(key)
                if entry.blocks is None:
                    entry.blocks = chunk
                    if entry.tiers:
                        self._changed[key] = None
            self._trim()

    def take_events(self) -> list[KVCacheEvent]:
        """The events due since the last call (vLLM publishes them with the step's own): removals of
        forgotten chunks, then each changed chunk's, in the order the chunks changed (a prompt's chunks in
        chain order)."""
        with self._lock:
            events: list[KVCacheEvent] = [
                blocks.removed(t) for blocks, tiers in self._forgotten for t in sorted(tiers)
            ]
            self._forgotten = []
            for key in self._changed:
                entry = self._entries[key]
                shown = entry.shown()
                if entry.blocks is not None:
                    events += [entry.blocks.removed(t) for t in sorted(entry.published - shown)]
                    events += [entry.blocks.stored(t) for t in sorted(shown - entry.published)]
                entry.published = shown
            self._changed = {}
        return events

    # ------------------------------------------------------------------ the daemon's side

    def on_event(self, event: WatchedEvent) -> None:
        """Follow one event of the daemon's feed (:class:`~tiercache.connector.watch.EventWatch`)."""
        with self._lock:
            if event.kind in (WatchedKind.RESYNC, WatchedKind.CLEARED):
                resync = event.kind is WatchedKind.RESYNC
                for key, entry in self._entries.items():
                    if entry.tiers and (resync or entry.handle == event.handle):
                        entry.tiers.clear()
                        self._changed[key] = None
            elif event.tier is not None:
                entry = self._entry(event.key)
                entry.handle = event.handle
                if event.kind is WatchedKind.STORED:
                    entry.tiers.add(event.tier)
                else:
                    entry.tiers.discard(event.tier)
                self._changed[event.key] = None
                self._trim()

    # ------------------------------------------------------------------ internals (under the lock)

    def _entry(self, key: bytes) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        else:
            self._entries.move_to_end(key)
        return entry

    def _trim(self) -> None:
        while len(self._entries) > self._max:
            key, entry = self._entries.popitem(last=False)
            self._changed.pop(key, None)
            if entry.published and entry.blocks is not None:
                self._forgotten.append((entry.blocks, frozenset(entry.published)))

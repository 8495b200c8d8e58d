"""tiercache.connector — the engine side of tiercache: a gRPC client of the daemon and KV copy helpers.

Typical use in an engine process::

    client = TierCacheClient.connect("unix:/run/user/1000/tiercache.sock", token=None)
    connector = KVConnector(client, namespace)
    hit = connector.load(prompt_tokens, PagedKV(kv_caches, block_ids))   # never raises on daemon trouble
    ...  # prefill the tokens after hit.tokens_loaded
    connector.store(prompt_tokens, PagedKV(kv_caches, block_ids))

Modules (one responsibility each):
    channel: address parsing, channel options, bearer-token metadata.
    errors: gRPC status -> typed tiercache errors (the one place).
    backoff: reconnect backoff.
    wire: core values <-> proto messages.
    results: typed results of the client's calls.
    client: ``TierCacheClient`` (deadlines, reconnect and re-register).
    dataplane: the daemon's shared-memory segment mapped into the engine.
    stream: byte-stream framing (pieces, zstd).
    kv: copies between chunk buffers and engine KV tensors (contiguous and paged layouts).
    policy: the core's load policies (``LoadPolicy``: wait_complete, best_effort, timeout, cost_aware) on
        the wire.
    outcomes: ``LoadResult`` / ``StoreResult``, token-weighted.
    layerwise: ``LayerwiseLoad`` (wait_layer) and ``LayerwiseSave`` (save_layer, commit, abort).
    prefill: ``PrefillClaim`` — single-flight prefill (wait, publish, release).
    engine: ``KVConnector`` — load / store that fall back to recompute on daemon trouble.

The connector never imports ``tiercache.daemon``.
"""

from tiercache.codec import Codec
from tiercache.policies.load import LoadPolicy
from tiercache.tiers.base import TierLevel

from .channel import ChannelConfig, Endpoint, parse_address
from .client import ClientConfig, TierCacheClient
from .engine import ConnectorConfig, KVConnector, LoadResult, StoreResult
from .kv import ContiguousKV, EngineKV, PagedKV, check_kv, chunk_to_kv, kv_to_chunk
from .layerwise import LayerwiseLoad, LayerwiseSave
from .prefill import PrefillClaim
from .results import (
    DataPlaneInfo,
    LoadLease,
    LookupInfo,
    PrefetchInfo,
    PrefillClaimInfo,
    Registration,
    SlotRef,
    StoreTicket,
    StreamChunk,
    StreamStoreResult,
)

__all__ = [
    "ChannelConfig",
    "ClientConfig",
    "Codec",
    "ConnectorConfig",
    "ContiguousKV",
    "DataPlaneInfo",
    "Endpoint",
    "EngineKV",
    "KVConnector",
    "LayerwiseLoad",
    "LayerwiseSave",
    "LoadLease",
    "LoadPolicy",
    "LoadResult",
    "LookupInfo",
    "PagedKV",
    "PrefetchInfo",
    "PrefillClaim",
    "PrefillClaimInfo",
    "Registration",
    "SlotRef",
    "StoreResult",
    "StoreTicket",
    "StreamChunk",
    "StreamStoreResult",
    "TierCacheClient",
    "TierLevel",
    "check_kv",
    "chunk_to_kv",
    "kv_to_chunk",
    "parse_address",
]

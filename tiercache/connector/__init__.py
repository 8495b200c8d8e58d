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
    rpcs: the daemon's RPCs as typed descriptors (request / response message types).
    results: typed results of the client's calls.
    connection: ``Connection`` — channel, deadlines, backoff, generations, re-registration (handle cache).
    client: ``TierCacheClient`` — one typed method per RPC.
    segments: the daemon's shared-memory segments mapped into the engine (``SlotMapping``, ``SegmentMaps``).
    stream: the connector's end of the byte stream (stores' first message, loads' order; pieces are coded
        by ``tiercache.wire.pieces``).
    kv: copies between chunk buffers and engine KV tensors (contiguous and paged layouts).
    paged: block copies of a paged cache, whatever the engine's block layout (block planes).
    policy: the core's load policies (``LoadPolicy``: wait_complete, best_effort, timeout, cost_aware) on
        the wire.
    outcomes: ``LoadResult`` / ``StoreResult``, token-weighted.
    layerwise: ``LayerwiseLoad`` (wait_layer) and ``LayerwiseSave`` (save_layer, commit, abort).
    config: ``ConnectorConfig`` and ``DataPlaneMode`` (auto, shm, stream: what an engine adapter asks for).
    dataplane: the ``DataPlane`` interface (load, load_layerwise, store, begin_save, prefill_publisher) and
        ``Medium`` (ENGINE, SHARED_MEMORY, BYTE_STREAM: the ends of a transfer).
    shm_plane: ``SharedMemoryPlane`` — copies straight between shared-memory slots and the engine's KV.
    stream_plane: ``ByteStreamPlane`` — whole chunks over gRPC byte streams.
    handlers: the data planes registered by (source medium, destination medium), and the one resolution of
        a ``DataPlaneMode`` against what the daemon offers (used by every engine adapter).
    prefill: ``PrefillLease`` — single-flight prefill (wait, publish, release).
    choice: ``DataPlaneChoice`` — a ``KVConnector``'s data plane (chosen again per registration).
    engine: ``KVConnector`` — load / store through the data plane; fall back to recompute.

The connector never imports ``tiercache.daemon``.
"""

from tiercache.codec import Codec
from tiercache.policies.load import LoadPolicy
from tiercache.tiers.base import TierLevel

from .channel import ChannelConfig, Endpoint, parse_address
from .client import TierCacheClient
from .config import ConnectorConfig, DataPlaneMode
from .connection import ClientConfig
from .dataplane import DataPlane, Medium
from .engine import KVConnector
from .kv import ContiguousKV, EngineKV, PagedKV, chunk_to_kv, kv_to_chunk
from .kv_check import check_kv
from .layerwise import LayerwiseLoad, LayerwiseSave
from .outcomes import LoadResult, StoreResult
from .prefill import PrefillLease
from .results import (
    LoadLease,
    LookupInfo,
    PrefetchInfo,
    PrefillClaimInfo,
    Registration,
    SegmentInfo,
    SlotRef,
    StoreGrant,
    StreamChunk,
    StreamStoreResult,
)

__all__ = [
    "ChannelConfig",
    "ClientConfig",
    "Codec",
    "ConnectorConfig",
    "ContiguousKV",
    "DataPlane",
    "DataPlaneMode",
    "Endpoint",
    "EngineKV",
    "KVConnector",
    "LayerwiseLoad",
    "LayerwiseSave",
    "LoadLease",
    "LoadPolicy",
    "LoadResult",
    "LookupInfo",
    "Medium",
    "PagedKV",
    "PrefetchInfo",
    "PrefillClaimInfo",
    "PrefillLease",
    "Registration",
    "SegmentInfo",
    "SlotRef",
    "StoreGrant",
    "StoreResult",
    "StreamChunk",
    "StreamStoreResult",
    "TierCacheClient",
    "TierLevel",
    "check_kv",
    "chunk_to_kv",
    "kv_to_chunk",
    "parse_address",
]

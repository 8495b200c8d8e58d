from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_DTYPE_UNSPECIFIED: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT32: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT16: _ClassVar[KVDtype]
    KV_DTYPE_BFLOAT16: _ClassVar[KVDtype]
    KV_DTYPE_FP8_E4M3: _ClassVar[KVDtype]
    KV_DTYPE_FP8_E5M2: _ClassVar[KVDtype]
    KV_DTYPE_INT8: _ClassVar[KVDtype]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_L1: _ClassVar[Tier]
    TIER_L2: _ClassVar[Tier]
    TIER_L3: _ClassVar[Tier]
    TIER_SHARED: _ClassVar[Tier]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_RAW: _ClassVar[Codec]
    CODEC_ZSTD: _ClassVar[Codec]

class LoadPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_POLICY_WAIT_COMPLETE: _ClassVar[LoadPolicy]
    LOAD_POLICY_BEST_EFFORT: _ClassVar[LoadPolicy]
    LOAD_POLICY_TIMEOUT: _ClassVar[LoadPolicy]
    LOAD_POLICY_COST_AWARE: _ClassVar[LoadPolicy]
KV_DTYPE_UNSPECIFIED: KVDtype
KV_DTYPE_FLOAT32: KVDtype
KV_DTYPE_FLOAT16: KVDtype
KV_DTYPE_BFLOAT16: KVDtype
KV_DTYPE_FP8_E4M3: KVDtype
KV_DTYPE_FP8_E5M2: KVDtype
KV_DTYPE_INT8: KVDtype
TIER_UNSPECIFIED: Tier
TIER_L1: Tier
TIER_L2: Tier
TIER_L3: Tier
TIER_SHARED: Tier
CODEC_RAW: Codec
CODEC_ZSTD: Codec
LOAD_POLICY_WAIT_COMPLETE: LoadPolicy
LOAD_POLICY_BEST_EFFORT: LoadPolicy
LOAD_POLICY_TIMEOUT: LoadPolicy
LOAD_POLICY_COST_AWARE: LoadPolicy

class PrefillModel(_message.Message):
    __slots__ = ("tokens_per_s", "quadratic_s")
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    QUADRATIC_S_FIELD_NUMBER: _ClassVar[int]
    tokens_per_s: float
    quadratic_s: float
    def __init__(self, tokens_per_s: _Optional[float] = ..., quadratic_s: _Optional[float] = ...) -> None: ...

class DeadlineModel(_message.Message):
    __slots__ = ("base_s", "per_1k_tokens_s", "cap_s")
    BASE_S_FIELD_NUMBER: _ClassVar[int]
    PER_1K_TOKENS_S_FIELD_NUMBER: _ClassVar[int]
    CAP_S_FIELD_NUMBER: _ClassVar[int]
    base_s: float
    per_1k_tokens_s: float
    cap_s: float
    def __init__(self, base_s: _Optional[float] = ..., per_1k_tokens_s: _Optional[float] = ..., cap_s: _Optional[float] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype", "chunk_tokens", "page_tokens", "mla")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MLA_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: KVDtype
    chunk_tokens: int
    page_tokens: int
    mla: bool
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[KVDtype, str]] = ..., chunk_tokens: _Optional[int] = ..., page_tokens: _Optional[int] = ..., mla: _Optional[bool] = ...) -> None: ...

class NamespaceSpec(_message.Message):
    __slots__ = ("model_id", "revision", "layout", "tokenizer_id", "tp_rank", "tp_size", "pp_rank", "pp_size", "adapter_id", "cache_salt")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    revision: str
    layout: Layout
    tokenizer_id: str
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    adapter_id: str
    cache_salt: str
    def __init__(self, model_id: _Optional[str] = ..., revision: _Optional[str] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., tokenizer_id: _Optional[str] = ..., tp_rank: _Optional[int] = ..., tp_size: _Optional[int] = ..., pp_rank: _Optional[int] = ..., pp_size: _Optional[int] = ..., adapter_id: _Optional[str] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class DataPlane(_message.Message):
    __slots__ = ("shm_segment", "slot_bytes", "num_slots", "segment_bytes", "fd_socket", "fd_grant", "max_chunk_bytes", "index_entries")
    SHM_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    FD_GRANT_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    shm_segment: str
    slot_bytes: int
    num_slots: int
    segment_bytes: int
    fd_socket: str
    fd_grant: bytes
    max_chunk_bytes: int
    index_entries: int
    def __init__(self, shm_segment: _Optional[str] = ..., slot_bytes: _Optional[int] = ..., num_slots: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., fd_socket: _Optional[str] = ..., fd_grant: _Optional[bytes] = ..., max_chunk_bytes: _Optional[int] = ..., index_entries: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("namespace", "engine_id", "prefill", "deadline")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    namespace: NamespaceSpec
    engine_id: str
    prefill: PrefillModel
    deadline: DeadlineModel
    def __init__(self, namespace: _Optional[_Union[NamespaceSpec, _Mapping]] = ..., engine_id: _Optional[str] = ..., prefill: _Optional[_Union[PrefillModel, _Mapping]] = ..., deadline: _Optional[_Union[DeadlineModel, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("handle", "layout", "chunk_bytes", "data_plane", "lease_ttl_s", "max_stream_message_bytes", "max_ttl_s", "control_socket", "packed_keys")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAM_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TTL_S_FIELD_NUMBER: _ClassVar[int]
    CONTROL_SOCKET_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    layout: Layout
    chunk_bytes: int
    data_plane: DataPlane
    lease_ttl_s: float
    max_stream_message_bytes: int
    max_ttl_s: float
    control_socket: str
    packed_keys: bool
    def __init__(self, handle: _Optional[bytes] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., chunk_bytes: _Optional[int] = ..., data_plane: _Optional[_Union[DataPlane, _Mapping]] = ..., lease_ttl_s: _Optional[float] = ..., max_stream_message_bytes: _Optional[int] = ..., max_ttl_s: _Optional[float] = ..., control_socket: _Optional[str] = ..., packed_keys: _Optional[bool] = ...) -> None: ...

class TierCount(_message.Message):
    __slots__ = ("tier", "chunks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    chunks: int
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., chunks: _Optional[int] = ...) -> None: ...

class TierTokens(_message.Message):
    __slots__ = ("tier", "tokens")
    TIER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    tokens: int
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., tokens: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("handle", "keys", "prefetch", "packed_keys")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    prefetch: bool
    packed_keys: bytes
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., prefetch: _Optional[bool] = ..., packed_keys: _Optional[bytes] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("chunks", "by_tier", "prefetch_id")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BY_TIER_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_ID_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    by_tier: _containers.RepeatedCompositeFieldContainer[TierCount]
    prefetch_id: int
    def __init__(self, chunks: _Optional[int] = ..., by_tier: _Optional[_Iterable[_Union[TierCount, _Mapping]]] = ..., prefetch_id: _Optional[int] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("handle", "keys", "timeout_s")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    timeout_s: float
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("ready", "prefetch_id")
    READY_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_ID_FIELD_NUMBER: _ClassVar[int]
    ready: int
    prefetch_id: int
    def __init__(self, ready: _Optional[int] = ..., prefetch_id: _Optional[int] = ...) -> None: ...

class CancelPrefetchRequest(_message.Message):
    __slots__ = ("handle", "prefetch_id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    PREFETCH_ID_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    prefetch_id: int
    def __init__(self, handle: _Optional[bytes] = ..., prefetch_id: _Optional[int] = ...) -> None: ...

class CancelPrefetchResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class BeginStoreRequest(_message.Message):
    __slots__ = ("handle", "keys", "start_depth", "ttl_s", "settle")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    START_DEPTH_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    start_depth: int
    ttl_s: float
    settle: Settlement
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., start_depth: _Optional[int] = ..., ttl_s: _Optional[float] = ..., settle: _Optional[_Union[Settlement, _Mapping]] = ...) -> None: ...

class SlotRef(_message.Message):
    __slots__ = ("index", "slot", "nbytes", "source")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    index: int
    slot: int
    nbytes: int
    source: Tier
    def __init__(self, index: _Optional[int] = ..., slot: _Optional[int] = ..., nbytes: _Optional[int] = ..., source: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BeginStoreResponse(_message.Message):
    __slots__ = ("ticket_id", "slots", "skipped", "expires_in_s")
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    ticket_id: int
    slots: _containers.RepeatedCompositeFieldContainer[SlotRef]
    skipped: _containers.RepeatedScalarFieldContainer[int]
    expires_in_s: float
    def __init__(self, ticket_id: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[SlotRef, _Mapping]]] = ..., skipped: _Optional[_Iterable[int]] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class CommitStoreRequest(_message.Message):
    __slots__ = ("handle", "ticket_id", "indices", "checksums")
    class ChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    ticket_id: int
    indices: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.ScalarMap[int, int]
    def __init__(self, handle: _Optional[bytes] = ..., ticket_id: _Optional[int] = ..., indices: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Mapping[int, int]] = ...) -> None: ...

class CommitStoreResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...

class AbortStoreRequest(_message.Message):
    __slots__ = ("handle", "ticket_id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    TICKET_ID_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    ticket_id: int
    def __init__(self, handle: _Optional[bytes] = ..., ticket_id: _Optional[int] = ...) -> None: ...

class AbortStoreResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: bool
    def __init__(self, aborted: _Optional[bool] = ...) -> None: ...

class AcquireLoadRequest(_message.Message):
    __slots__ = ("handle", "keys", "ttl_s", "policy", "timeout_s", "prompt_tokens", "settle", "more_chains")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    MORE_CHAINS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    policy: LoadPolicy
    timeout_s: float
    prompt_tokens: int
    settle: Settlement
    more_chains: _containers.RepeatedCompositeFieldContainer[KeyChain]
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ..., policy: _Optional[_Union[LoadPolicy, str]] = ..., timeout_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., settle: _Optional[_Union[Settlement, _Mapping]] = ..., more_chains: _Optional[_Iterable[_Union[KeyChain, _Mapping]]] = ...) -> None: ...

class KeyChain(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AcquireLoadResponse(_message.Message):
    __slots__ = ("lease_id", "slots", "expires_in_s", "cached", "estimated_load_s", "estimated_recompute_s", "more")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_LOAD_S_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_RECOMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    slots: _containers.RepeatedCompositeFieldContainer[SlotRef]
    expires_in_s: float
    cached: int
    estimated_load_s: float
    estimated_recompute_s: float
    more: _containers.RepeatedCompositeFieldContainer[AcquireLoadResponse]
    def __init__(self, lease_id: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[SlotRef, _Mapping]]] = ..., expires_in_s: _Optional[float] = ..., cached: _Optional[int] = ..., estimated_load_s: _Optional[float] = ..., estimated_recompute_s: _Optional[float] = ..., more: _Optional[_Iterable[_Union[AcquireLoadResponse, _Mapping]]] = ...) -> None: ...

class ReleaseLoadRequest(_message.Message):
    __slots__ = ("handle", "lease_id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    lease_id: int
    def __init__(self, handle: _Optional[bytes] = ..., lease_id: _Optional[int] = ...) -> None: ...

class ReleaseLoadResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("handle", "keys")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    def __init__(self, chunks: _Optional[int] = ...) -> None: ...

class PurgeRequest(_message.Message):
    __slots__ = ("handle",)
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    def __init__(self, handle: _Optional[bytes] = ...) -> None: ...

class PurgeResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "chunks", "used_bytes", "capacity_bytes", "hits", "misses", "evictions", "promotions", "demotions", "corrupt_reads", "lookup_hit_tokens", "load_success_tokens", "effective_hit_tokens", "latency_s", "bytes_per_s", "dropped_chunks", "errors", "payload_bytes", "utilisation")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_READS_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SUCCESS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DROPPED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    chunks: int
    used_bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    evictions: int
    promotions: int
    demotions: int
    corrupt_reads: int
    lookup_hit_tokens: int
    load_success_tokens: int
    effective_hit_tokens: int
    latency_s: float
    bytes_per_s: float
    dropped_chunks: int
    errors: int
    payload_bytes: int
    utilisation: float
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., chunks: _Optional[int] = ..., used_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., promotions: _Optional[int] = ..., demotions: _Optional[int] = ..., corrupt_reads: _Optional[int] = ..., lookup_hit_tokens: _Optional[int] = ..., load_success_tokens: _Optional[int] = ..., effective_hit_tokens: _Optional[int] = ..., latency_s: _Optional[float] = ..., bytes_per_s: _Optional[float] = ..., dropped_chunks: _Optional[int] = ..., errors: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., utilisation: _Optional[float] = ...) -> None: ...

class PrefillStats(_message.Message):
    __slots__ = ("active_claims", "claimed_chunks", "waits", "takeovers", "expired_claims")
    ACTIVE_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    active_claims: int
    claimed_chunks: int
    waits: int
    takeovers: int
    expired_claims: int
    def __init__(self, active_claims: _Optional[int] = ..., claimed_chunks: _Optional[int] = ..., waits: _Optional[int] = ..., takeovers: _Optional[int] = ..., expired_claims: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tiers", "namespaces", "active_leases", "expired_leases", "single_flight_joins", "pending_writes", "failed_writes", "prefill", "recomputed_tokens", "deferred_writes")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_LEASES_FIELD_NUMBER: _ClassVar[int]
    SINGLE_FLIGHT_JOINS_FIELD_NUMBER: _ClassVar[int]
    PENDING_WRITES_FIELD_NUMBER: _ClassVar[int]
    FAILED_WRITES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_WRITES_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    namespaces: int
    active_leases: int
    expired_leases: int
    single_flight_joins: int
    pending_writes: int
    failed_writes: int
    prefill: PrefillStats
    recomputed_tokens: int
    deferred_writes: int
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., namespaces: _Optional[int] = ..., active_leases: _Optional[int] = ..., expired_leases: _Optional[int] = ..., single_flight_joins: _Optional[int] = ..., pending_writes: _Optional[int] = ..., failed_writes: _Optional[int] = ..., prefill: _Optional[_Union[PrefillStats, _Mapping]] = ..., recomputed_tokens: _Optional[int] = ..., deferred_writes: _Optional[int] = ...) -> None: ...

class ClaimPrefillRequest(_message.Message):
    __slots__ = ("handle", "keys", "ttl_s")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class ClaimPrefillResponse(_message.Message):
    __slots__ = ("claim_id", "cached", "wait", "lead", "takeovers")
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    LEAD_FIELD_NUMBER: _ClassVar[int]
    TAKEOVERS_FIELD_NUMBER: _ClassVar[int]
    claim_id: int
    cached: int
    wait: int
    lead: int
    takeovers: int
    def __init__(self, claim_id: _Optional[int] = ..., cached: _Optional[int] = ..., wait: _Optional[int] = ..., lead: _Optional[int] = ..., takeovers: _Optional[int] = ...) -> None: ...

class WaitPrefillRequest(_message.Message):
    __slots__ = ("handle", "keys", "timeout_s", "claim_id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    timeout_s: float
    claim_id: int
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., timeout_s: _Optional[float] = ..., claim_id: _Optional[int] = ...) -> None: ...

class WaitPrefillResponse(_message.Message):
    __slots__ = ("cached",)
    CACHED_FIELD_NUMBER: _ClassVar[int]
    cached: int
    def __init__(self, cached: _Optional[int] = ...) -> None: ...

class ReleasePrefillRequest(_message.Message):
    __slots__ = ("handle", "claim_id")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    claim_id: int
    def __init__(self, handle: _Optional[bytes] = ..., claim_id: _Optional[int] = ...) -> None: ...

class ReleasePrefillResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ReportUsageRequest(_message.Message):
    __slots__ = ("handle", "effective_chunks", "recomputed_tokens", "loaded_tokens", "effective_tokens", "read_keys")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOADED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    READ_KEYS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    effective_chunks: _containers.RepeatedCompositeFieldContainer[TierCount]
    recomputed_tokens: int
    loaded_tokens: _containers.RepeatedCompositeFieldContainer[TierTokens]
    effective_tokens: _containers.RepeatedCompositeFieldContainer[TierTokens]
    read_keys: bytes
    def __init__(self, handle: _Optional[bytes] = ..., effective_chunks: _Optional[_Iterable[_Union[TierCount, _Mapping]]] = ..., recomputed_tokens: _Optional[int] = ..., loaded_tokens: _Optional[_Iterable[_Union[TierTokens, _Mapping]]] = ..., effective_tokens: _Optional[_Iterable[_Union[TierTokens, _Mapping]]] = ..., read_keys: _Optional[bytes] = ...) -> None: ...

class ReportUsageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Settlement(_message.Message):
    __slots__ = ("release_lease_ids", "effective_chunks", "recomputed_tokens", "loaded_tokens", "effective_tokens", "read_keys")
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOADED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    READ_KEYS_FIELD_NUMBER: _ClassVar[int]
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    effective_chunks: _containers.RepeatedCompositeFieldContainer[TierCount]
    recomputed_tokens: int
    loaded_tokens: _containers.RepeatedCompositeFieldContainer[TierTokens]
    effective_tokens: _containers.RepeatedCompositeFieldContainer[TierTokens]
    read_keys: bytes
    def __init__(self, release_lease_ids: _Optional[_Iterable[int]] = ..., effective_chunks: _Optional[_Iterable[_Union[TierCount, _Mapping]]] = ..., recomputed_tokens: _Optional[int] = ..., loaded_tokens: _Optional[_Iterable[_Union[TierTokens, _Mapping]]] = ..., effective_tokens: _Optional[_Iterable[_Union[TierTokens, _Mapping]]] = ..., read_keys: _Optional[bytes] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_sequence", "epoch")
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    epoch: int
    def __init__(self, after_sequence: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class CacheEvent(_message.Message):
    __slots__ = ("sequence", "kind", "tier", "handle", "key", "evicted", "epoch", "source")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[CacheEvent.Kind]
        KIND_STORED: _ClassVar[CacheEvent.Kind]
        KIND_REMOVED: _ClassVar[CacheEvent.Kind]
        KIND_CLEARED: _ClassVar[CacheEvent.Kind]
        KIND_RESYNC: _ClassVar[CacheEvent.Kind]
    KIND_UNSPECIFIED: CacheEvent.Kind
    KIND_STORED: CacheEvent.Kind
    KIND_REMOVED: CacheEvent.Kind
    KIND_CLEARED: CacheEvent.Kind
    KIND_RESYNC: CacheEvent.Kind
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: CacheEvent.Kind
    tier: Tier
    handle: bytes
    key: bytes
    evicted: bool
    epoch: int
    source: Tier
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[_Union[CacheEvent.Kind, str]] = ..., tier: _Optional[_Union[Tier, str]] = ..., handle: _Optional[bytes] = ..., key: _Optional[bytes] = ..., evicted: _Optional[bool] = ..., epoch: _Optional[int] = ..., source: _Optional[_Union[Tier, str]] = ...) -> None: ...

class StreamStoreMessage(_message.Message):
    __slots__ = ("handle", "start_depth", "key", "index", "offset", "data", "codec", "last", "chunk_bytes", "keys")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    START_DEPTH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    start_depth: int
    key: bytes
    index: int
    offset: int
    data: bytes
    codec: Codec
    last: bool
    chunk_bytes: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, handle: _Optional[bytes] = ..., start_depth: _Optional[int] = ..., key: _Optional[bytes] = ..., index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., codec: _Optional[_Union[Codec, str]] = ..., last: _Optional[bool] = ..., chunk_bytes: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StreamStoreResponse(_message.Message):
    __slots__ = ("stored", "skipped")
    STORED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    skipped: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stored: _Optional[int] = ..., skipped: _Optional[_Iterable[int]] = ...) -> None: ...

class StreamLoadRequest(_message.Message):
    __slots__ = ("handle", "keys", "codec", "max_message_bytes")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    handle: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    codec: Codec
    max_message_bytes: int
    def __init__(self, handle: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ..., codec: _Optional[_Union[Codec, str]] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class StreamLoadMessage(_message.Message):
    __slots__ = ("index", "key", "offset", "data", "codec", "last", "chunk_bytes", "source")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    index: int
    key: bytes
    offset: int
    data: bytes
    codec: Codec
    last: bool
    chunk_bytes: int
    source: Tier
    def __init__(self, index: _Optional[int] = ..., key: _Optional[bytes] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., codec: _Optional[_Union[Codec, str]] = ..., last: _Optional[bool] = ..., chunk_bytes: _Optional[int] = ..., source: _Optional[_Union[Tier, str]] = ...) -> None: ...

class EchoMessage(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class SinkSummary(_message.Message):
    __slots__ = ("messages", "bytes")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    messages: int
    bytes: int
    def __init__(self, messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SourceRequest(_message.Message):
    __slots__ = ("message_bytes", "count")
    MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    message_bytes: int
    count: int
    def __init__(self, message_bytes: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

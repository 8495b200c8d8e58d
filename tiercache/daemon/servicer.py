"""The ``tiercache.v1.KVCacheService`` servicer, put together from its parts.

The servicer only translates. Its handlers are grouped by what they serve, each group a module of its own
that owns the state it needs; the decorators and dependencies they share are in :mod:`.rpc`, the
engine-facing placement rules in :mod:`tiercache.cache.rules`:

* :mod:`.kv_namespaces`: Register, Lookup, Prefetch, CancelPrefetch, Pin, Unpin, Purge, ReportUsage, Stats,
  WatchEvents (running prefetches by id);
* :mod:`.kv_shared`: BeginStore, CommitStore, AbortStore, AcquireLoad, ReleaseLoad (tickets and leases by
  handle);
* :mod:`.kv_prefill`: ClaimPrefill, WaitPrefill, ReleasePrefill (prefill claims by handle);
* :mod:`.kv_streams`: StreamStore, StreamLoad.

The generated base class comes last, so that its UNIMPLEMENTED stubs never shadow a handler.

Primitives:
    KVCacheServicer: the servicer.
"""

from __future__ import annotations

from tiercache.proto import tiercache_pb2_grpc as pb_grpc

from .kv_namespaces import NamespaceRpcs
from .kv_prefill import PrefillRpcs
from .kv_shared import SharedMemoryRpcs
from .kv_streams import StreamRpcs


class KVCacheServicer(
    NamespaceRpcs, SharedMemoryRpcs, PrefillRpcs, StreamRpcs, pb_grpc.KVCacheServiceServicer
):
    """``tiercache.v1.KVCacheService`` over a :class:`~tiercache.cache.CacheManager`."""

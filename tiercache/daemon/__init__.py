"""tiercache.daemon — the cache served over gRPC to engine processes (``tiercache-daemon``).

Modules, each with one responsibility:
    cli: the console entry point (exit codes 0 / 1 / 2).
    options: the loader: flags, ``TIERCACHE_*`` variables, the TOML file and its example, all generated from
        the configs' option declarations (defaults < TOML file < ``TIERCACHE_*`` < flags).
    config: the frozen per-component configs, their option declarations and their cross-checks.
    parsers: value parsers of the daemon's own options (TCP address, log level, L1 device).
    auth: bearer tokens -> tenant.
    handles: handle -> tenant, ticket/lease -> handle.
    convert: request-specific conversions (keys, durations, responses) with field-named validation;
        shared values convert through :mod:`tiercache.wire`.
    status: tiercache errors -> gRPC status codes (the one place).
    events: numbered cache events, replay buffer, fan-out to WatchEvents subscribers.
    streams: the byte-stream data plane (pieces, zstd).
    metrics: Prometheus metrics in a registry of their own, optional /metrics endpoint.
    rpc: what the handlers share: the caller, executors, and the decorators that authenticate, check the
        request's handle and turn errors into statuses.
    kv_namespaces, kv_shared, kv_prefill, kv_streams: the KVCacheService handlers, by what they serve.
    servicer: KVCacheService put together from its handlers (translation only).
    diagnostics: the Diagnostics servicer (echo baselines).
    listen: the unix socket file (stale check, mode, removal).
    server: tiers + cache manager + grpc.aio server + health, graceful shutdown.
"""

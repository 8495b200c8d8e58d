"""tiercache.testing — the process harness and fault machinery shared by tests, benches and demos.

Importing the package imports nothing else (an engine running as another user, with a copy of the package
and no torch, imports :mod:`.engine`).

Modules:
    daemon: a daemon process (start and wait until it serves, stop, kill -9, restart on the same L3).
    embedded: a daemon for one bench or fault run: given, or started with explicit sizes.
    redis: a private Redis Cluster, single server, or unix-socket server.
    engine: an engine subprocess and its one line protocol (both sides).
    plugin: the pytest plugin with the shared fixtures (daemons, Redis, engines).
    faults: kill -9 on one L3, corrupted L3 values, engines killed while holding, garbage RPCs.
    soak: many engines against one daemon, its footprint measured between two phases.
    waits: wait_until, polling with a deadline for what a daemon or a background thread does on its own.
    vllm_server: a ``vllm serve`` process (start, wait for /health, its KV cache size, stop).
"""

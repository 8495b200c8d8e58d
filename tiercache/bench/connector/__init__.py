"""``tiercache-bench connector``: store/load through the connector against memcpy, bare echo and streams.

Modules: command (flags), run (the measurement), figure (a figure next to its baseline, the targets),
baselines (bare gRPC echo and streams on the daemon's socket), h2d (the GPU line), report (table, JSON,
charts).
"""

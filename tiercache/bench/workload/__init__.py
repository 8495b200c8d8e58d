"""``tiercache-bench workload``: traces replayed through the cache; token-weighted hits per tier.

Modules: command (flags), run (the measurement), traces (synthetic generators, JSONL), replay (in-process
and daemon targets), reference (Belady's MIN and LRU on the same trace), report (table, JSON, charts).
"""

"""``tiercache-bench tiers``: put/get GB/s and latency of each tier against the machine's ceilings.

Modules: command (flags, charts), run (the measurement), targets (which ceiling each figure is judged
against), report (table, JSON), lmdb_ceiling and shared_ceiling (raw py-lmdb and redis-py ceilings).
"""

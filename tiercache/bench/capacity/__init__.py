"""``tiercache-bench capacity``: the share of an L2 tier's bytes that mixes of chunk sizes use.

Modules: command (flags), run (the measurement), report (table, JSON, charts).
"""

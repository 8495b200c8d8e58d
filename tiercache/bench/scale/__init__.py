"""``tiercache-bench scale``: lookup latency, index memory, eviction cost and warm restart vs indexed chunks.

Modules: command (flags), run (the measurement), fill (a bulk L3 fill), report (table, JSON, charts).
"""

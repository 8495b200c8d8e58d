"""``tiercache-bench engine``: time to first token of a real model with and without tiercache.

Modules: command (flags; also ``python -m tiercache.bench.engine``), run (the measurement), report (table,
JSON).
"""

"""``tiercache-bench concurrency``: aggregate put+get GB/s of an in-process cache manager under threads.

Modules: command (flags), run (the measurement and its JSON document), report (the table).
"""

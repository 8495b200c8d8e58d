"""``tiercache-bench fleet``: a trace spread over several hosts' caches, the shared tier off vs on.

Modules: command (flags), run (the measurement), report (table, JSON).
"""

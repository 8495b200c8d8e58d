"""``tiercache-bench compare``: the same store/load workload against recompute, Redis and plain files.

Modules: command (flags), run (the measurement), peers (the chunk stores compared), refmodel (the seeded
reference model whose prefill is recompute), report (table, JSON, charts).
"""

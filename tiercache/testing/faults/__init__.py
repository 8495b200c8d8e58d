"""Fault injection against real daemon processes, as figures (``tiercache-bench faults``, ``tests/faults``).

Modules:
    workload: the deterministic prompts and KV of the runs, and a bit-exact check of every load.
    engine: the engine process of the runs (holds leases, tickets, claims, saves; soaks).
    kill: kill -9 of the daemon mid-stores, many times on one L3.
    corrupt: corrupted L3 values read by a restarted daemon.
    engines: engines killed while holding things; what they held drains.
    garbage: undecodable requests on every RPC.
"""

"""``tiercache-bench serve``: the serving benchmark of record (a real ``vllm serve`` under concurrent load).

Modules: command (flags, run), workloads (seeded sessions, JSONL), client (the asyncio client), columns (one
``vllm serve`` per column, with its daemon or peer), run (every cell on every column, the daemon kill),
report (rows, table, charts).
"""

"""``tiercache-bench vllm``: TTFT of fresh vLLM engines with tiercache, vLLM's prefix cache and peers.

(Not named ``vllm``: the engine script that runs by path from ``tiercache/bench/`` imports ``vllm``.)

Modules: command (flags, table, charts), run (every column of a run), columns (the engine runner and the
plain and tiercache columns), peers (LMCache and ExampleConnector columns), throughput (the throughput line).
"""

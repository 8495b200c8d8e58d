"""Helpers shared by several benchmarks: measurement, verification and output, one responsibility each.

Modules:
    timing: throughput and per-call latency of a timed phase.
    spread: figures and ratios kept round by round (median, lowest, highest).
    payload: seeded bf16 KV-like payloads and destination buffers.
    tier_ops: put/get of one tier, timed and verified (``RoundTripError``).
    kvcheck: engine-side KV tensors and their byte-for-byte verification.
    layout_cases: the KV layouts (``--layouts``) the connector and workload benchmarks measure.
    workdir: a run's temporary work directory.
    progress: a progress bar on stderr.
    documents: the JSON documents of runs.  plot: PNG charts.
"""

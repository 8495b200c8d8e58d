"""tiercache.bench — the ``tiercache-bench`` storage benchmark.

Modules:
    cli: ``main(argv)``, the argparse front end (subcommand ``tiers``).
    runner: ``TiersBenchConfig`` and ``run_tiers``, which measures ceilings and tiers size by size.
    ceilings: the machine's own ceilings (memcpy, buffered disk write and read) and a machine description.
    tiers: put/get measurement of one tier and round-trip verification (``verify_round_trip``).
    targets: which ceiling each tier figure is compared against, and the target ratio.
    report: the plain-text table and the JSON document.
    payload: random bf16 KV-like payloads and destination buffers.
    timing: per-call latency and throughput of a timed phase.
"""

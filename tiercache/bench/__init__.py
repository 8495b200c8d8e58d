"""tiercache.bench — the ``tiercache-bench`` storage benchmarks.

One subpackage per benchmark, each with the same shape (:class:`~tiercache.bench.command.Benchmark`):
``command`` (its flags, the config built from them), ``run`` (the measurement) and ``report`` (table, JSON
document, charts), plus the modules only that benchmark needs:
    tiers, connector, workload, compare, concurrency, scale, capacity, fleet, layerwise, singleflight,
    engine, vllm_engines (the ``vllm`` subcommand).

Shared by them:
    cli: ``main(argv)``, the registry of subcommands (``COMMANDS``).
    command: the benchmark protocol and what every subcommand does around its run (``finish``, failures).
    args: argument types and shared flag groups.  ceilings: memcpy and disk ceilings; the machine.
    tables: plain-text tables.  common: measurement, verification and output helpers (timing, spread,
    payload, tier put/get, KV checks, layouts, work directory, progress, JSON documents, PNG charts).

The process harness (daemons, Redis, engine subprocesses), fault injection and the soak are test machinery
in :mod:`tiercache.testing`; the ``faults`` and ``soak`` subcommands report over it. ``vllm_engine`` is the
engine script of the ``vllm`` benchmark, run by path (also by LMCache's own virtualenv).
"""

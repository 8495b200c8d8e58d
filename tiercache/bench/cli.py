"""The ``tiercache-bench`` command line (also ``python -m tiercache.bench``): a registry of benchmarks.

Each benchmark is a subpackage ``tiercache.bench.<name>`` whose ``command`` module has the shape of
:class:`~tiercache.bench.command.Benchmark` (``configure_parser(parser)``, ``run(args) -> int``); its
docstring's first paragraph is the subcommand's description. :data:`COMMANDS` lists them in ``--help`` order:
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
    layerwise, singleflight, engine, vllm, serve: further benchmarks, registered when their modules import.
    sglang: SGLang HiCache's zero-copy storage calls through TierCacheStorage vs memcpy (sglang extra).

Every subcommand prints a table; ``--json PATH`` writes every figure with the machine and config,
``--plot PATH.png`` a chart. Exit status: 0 on success (missed targets are reported, not failed); 1 when a
round trip lost or changed bytes, or a tier, the daemon, the disk or shared memory failed; 2 on bad
arguments.

Primitives:
    main: the entry point.
    build_parser: the argparse parser.
    Command / COMMANDS: the registry (name, command module, help, required).
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from .command import Benchmark

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand.

    Attributes:
        name: the subcommand.
        module: the benchmark's command module, relative to this package (e.g. ``.tiers.command``).
        help: one line for ``--help``.
        required: a missing or broken module is an error (False: the subcommand is left out, with a
            warning when its module exists but fails to import).
    """

    name: str
    module: str
    help: str
    required: bool = True


COMMANDS: tuple[Command, ...] = (
    Command("tiers", ".tiers.command", "put/get GB/s and latency per tier against memcpy and disk ceilings"),
    Command(
        "connector",
        ".connector.command",
        "store/load GB/s through the connector vs memcpy; lookup vs bare echo; byte stream vs bare stream",
    ),
    Command(
        "workload",
        ".workload.command",
        "replay synthetic or JSONL traces; token-weighted hits per tier, bytes moved, prefill saved",
    ),
    Command(
        "compare", ".compare.command", "the same store/load workload vs recompute, Redis and plain files"
    ),
    Command(
        "concurrency",
        ".concurrency.command",
        "aggregate put+get GB/s of an in-process cache manager under 1, 2, 4 threads vs memcpy",
    ),
    Command(
        "scale",
        ".scale.command",
        "lookup latency, index memory, eviction cost and warm restart from 1K to 1M indexed chunks",
    ),
    Command(
        "capacity",
        ".capacity.command",
        "the share of an L2 tier's bytes that mixes of chunk sizes use, small pages vs one page per slot",
    ),
    Command(
        "layerwise",
        ".layerwise.command",
        "overlap of layerwise loading with per-layer compute, as a measured timeline",
        required=False,
    ),
    Command(
        "singleflight",
        ".singleflight.command",
        "identical requests on a cold cache, with and without single-flight prefill",
        required=False,
    ),
    Command(
        "engine",
        ".engine.command",
        "time to first token of a real model with and without tiercache",
        required=False,
    ),
    Command(
        "fleet",
        ".fleet.command",
        "a trace spread over several hosts' caches, the shared (Redis Cluster) tier off vs on",
    ),
    Command(
        "faults",
        ".faults.command",
        "kill -9 mid-stores, corrupted L3 values, killed engines, garbage RPCs: torn / lost / detected",
    ),
    Command(
        "soak", ".soak.command", "engine processes storing and loading for minutes; errors and daemon drift"
    ),
    Command(
        "vllm",
        ".vllm_engines.command",
        "TTFT of fresh vLLM engines: tiercache vs vLLM's prefix cache, LMCache and ExampleConnector",
        required=False,
    ),
    Command(
        "serve",
        ".serve.command",
        "a real vllm serve under concurrent multi-turn load: plain, ideal, tiercache, LMCache, native",
        required=False,
    ),
    Command(
        "sglang",
        ".sglang.command",
        "SGLang HiCache's batch_set_v1 / batch_get_v1 through TierCacheStorage vs memcpy (sglang extra)",
        required=False,
    ),
)
"""Every subcommand, in ``--help`` order."""


def _load(command: Command) -> Benchmark | None:
    name = f"{__package__}{command.module}"
    try:
        return cast(Benchmark, importlib.import_module(command.module, __package__))
    except ModuleNotFoundError as exc:
        if command.required or exc.name not in (
            name,
            name.rpartition(".")[0],
        ):  # absent: the module or its package
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

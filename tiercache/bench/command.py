"""The shape of a ``tiercache-bench`` benchmark, and what every subcommand does around its measurement.

A benchmark is a subpackage ``tiercache.bench.<name>``: its ``command`` module (the :class:`Benchmark`
protocol: flags in, exit status out) builds the run's config from the flags, calls its ``run`` module's
measurement and hands its ``report`` module's table, JSON document and charts to :func:`finish`. The CLI
(:mod:`tiercache.bench.cli`) only lists the command modules.

Primitives:
    Benchmark: the protocol of a benchmark's command module (``configure_parser``, ``run``).
    progress_to_stderr: show the package's INFO log lines on stderr during a run (unless ``--quiet``).
    torch_threads: run with a given number of torch intra-op threads.
    failure_status: print why a run failed and return exit status 1.
    FAILURES: the exception types a run reports as a failed run (exit 1) rather than a crash.
    finish: write ``--json`` and ``--plot`` and print the table; exit status 0 (1 if the plot failed).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import grpc
import torch

from tiercache.errors import TierCacheError
from tiercache.testing.daemon import DaemonStartError

from .common.documents import write_document
from .common.plot import Chart, PlotUnavailableError, save_chart
from .common.tier_ops import RoundTripError
from .connector.baselines import EchoMismatchError

FAILURES: tuple[type[BaseException], ...] = (
    RoundTripError,
    EchoMismatchError,
    DaemonStartError,
    TierCacheError,
    grpc.RpcError,
    ImportError,
    OSError,
    LookupError,
    ValueError,
    RuntimeError,
)
"""Failures reported as a failed run (exit status 1) with a one-line reason."""


class Benchmark(Protocol):
    """A benchmark's command module, as the CLI registry sees it (its docstring's first paragraph is the
    subcommand's description)."""

    def configure_parser(self, parser: argparse.ArgumentParser) -> None:
        """Add the benchmark's flags to ``parser``."""

    def run(self, args: argparse.Namespace) -> int:
        """Measure, print the table, write ``--json`` / ``--plot``; the exit status (0, 1 on a failed run)."""


@contextlib.contextmanager
def progress_to_stderr(enabled: bool) -> Iterator[None]:
    """Show this package's INFO progress on stderr for the duration of the run (then restore logging)."""
    if not enabled:
        yield
        return
    pkg = logging.getLogger(__package__ or __name__)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("tiercache-bench: %(message)s"))
    old_level = pkg.level
    pkg.addHandler(handler)
    pkg.setLevel(logging.INFO)
    try:
        yield
    finally:
        pkg.removeHandler(handler)
        pkg.setLevel(old_level)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` torch intra-op threads (unchanged when None), then restore the previous count."""
    if threads is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def failure_status(exc: BaseException) -> int:
    """Print why the run failed (a verification failure says so plainly) and return 1."""
    if isinstance(exc, (RoundTripError, EchoMismatchError)):
        print(f"tiercache-bench: round trip FAILED: {exc}", file=sys.stderr)
    else:
        print(f"tiercache-bench: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


def finish(args: argparse.Namespace, doc: Mapping[str, Any], table: str, charts: Sequence[Chart] = ()) -> int:
    """Write ``args.json`` and ``args.plot`` (when given), then print ``table``.

    Returns:
        0, or 1 when a plot was asked for and could not be drawn (the table and JSON are still written).
    """
    status = 0
    if getattr(args, "json", None) is not None:
        write_document(doc, args.json)
    if getattr(args, "plot", None) is not None:
        try:
            save_chart(charts, args.plot)
        except (PlotUnavailableError, ValueError, OSError) as exc:
            print(f"tiercache-bench: --plot: {exc}", file=sys.stderr)
            status = 1
    print(table)
    return status

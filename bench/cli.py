"""The ``tiercache-bench`` command line (also ``python -m tiercache.bench``).

Subcommands:
    tiers: put/get GB/s and per-call latency of L1, L2 and L3 against the machine's memcpy and disk
        ceilings, measured in the same run; a table on stdout, optionally every figure as JSON.

Exit status: 0 on success (missed targets are reported, not failed); 1 when a round trip lost or changed
bytes or a tier, the disk or shared memory failed; 2 on bad arguments.

Primitives:
    main: the entry point.
    build_parser: the argparse parser.
    parse_size / parse_sizes: ``256K``, ``1M``, ``1.5MiB``, ``4096`` -> bytes (binary units).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tiercache.errors import InvalidArgumentError, TierCacheError
from tiercache.tiers.base import TierLevel
from tiercache.tiers.lmdb import Codec

from .report import format_report, write_json
from .runner import TiersBenchConfig, run_tiers
from .tiers import RoundTripError, TierOptions

logger = logging.getLogger(__name__)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SHIFTS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional binary unit (``K``, ``M``, ``G``, ``T``; ``KiB``/``KB`` too).

    Raises:
        argparse.ArgumentTypeError: not a size, or not a positive whole number of bytes.
    """
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 256K, 1M, 4MiB, 1048576)")
    value = float(match.group(1)) * (1 << _SHIFTS[match.group(2).lower()])
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of bytes")
    return int(value)


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated sizes, e.g. ``256K,1M,4M`` (see :func:`parse_size`)."""
    return tuple(parse_size(part) for part in text.split(",") if part.strip())


def parse_levels(text: str) -> tuple[TierLevel, ...]:
    """Comma-separated tier names, e.g. ``L1,L3``, without duplicates, in the order given.

    Raises:
        argparse.ArgumentTypeError: an unknown name (the message lists the valid ones).
    """
    levels: list[TierLevel] = []
    for part in (p.strip().upper() for p in text.split(",") if p.strip()):
        if part not in TierLevel.__members__:
            valid = ",".join(TierLevel.__members__)
            raise argparse.ArgumentTypeError(f"unknown tier {part!r}; valid: {valid}")
        if TierLevel[part] not in levels:
            levels.append(TierLevel[part])
    if not levels:
        raise argparse.ArgumentTypeError("at least one tier is needed")
    return tuple(levels)


def _codec(text: str) -> Codec:
    try:
        return Codec.from_name(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(text: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``; any other name must be a usable torch device."""
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available here")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are supported")
    return text


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def _add_tiers_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tiers",
        help="put/get GB/s and latency per tier against memcpy and disk ceilings",
        description="Measure put/get throughput and per-call latency of each tier and, in the same run, the "
        "machine's memcpy and buffered disk write/read ceilings; print each figure as a ratio to its ceiling.",
    )
    p.add_argument("--tiers", type=parse_levels, default=parse_levels("L1,L2,L3"), help="default L1,L2,L3")
    p.add_argument(
        "--chunk-sizes",
        type=parse_sizes,
        default=parse_sizes("256K,1M,4M,16M,32M"),
        help="comma-separated chunk sizes (binary units); default 256K,1M,4M,16M,32M",
    )
    p.add_argument(
        "--bytes-per-size",
        type=parse_size,
        default=256 << 20,
        help="payload bytes moved per chunk size (256M)",
    )
    p.add_argument("--batch", type=_positive_int, default=8, help="chunks per put/get call (8)")
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory for L3 and the disk ceiling (a temporary directory is made inside and removed); "
        "default: the user cache dir or the system temp dir",
    )
    p.add_argument("--codec", type=_codec, default=Codec.RAW, help="L3 codec: raw or zstd (raw)")
    p.add_argument("--zstd-level", type=int, default=3, help="L3 zstd level (3)")
    p.add_argument("--durable", action="store_true", help="L3 fsyncs every commit")
    p.add_argument(
        "--device", type=_device, default="auto", help="L1 device: auto (cuda when available), cpu, cuda[:n]"
    )
    p.add_argument("--warmup", type=_non_negative_int, default=2, help="untimed rounds per tier and size (2)")
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch intra-op threads for the run (torch's default)",
    )
    p.add_argument("--seed", type=int, default=0, help="payload seed (0)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=_run_tiers)


def build_parser() -> argparse.ArgumentParser:
    """The ``tiercache-bench`` parser with its subcommands."""
    parser = argparse.ArgumentParser(prog="tiercache-bench", description="tiercache storage benchmarks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_tiers_parser(sub)
    return parser


def _config(args: argparse.Namespace) -> TiersBenchConfig:
    options = TierOptions(
        l1_device=args.device,
        codec=args.codec,
        zstd_level=args.zstd_level,
        durable=args.durable,
        batch=args.batch,
        warmup_rounds=args.warmup,
    )
    return TiersBenchConfig(
        levels=args.tiers,
        chunk_sizes=args.chunk_sizes,
        bytes_per_size=args.bytes_per_size,
        work_root=args.dir,
        options=options,
        seed=args.seed,
    )


@contextlib.contextmanager
def _progress_to_stderr(enabled: bool) -> Iterator[None]:
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
def _torch_threads(threads: int | None) -> Iterator[None]:
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


def _run_tiers(args: argparse.Namespace) -> int:
    config = _config(args)
    with _progress_to_stderr(not args.quiet), _torch_threads(args.threads):
        try:
            report = run_tiers(config)
        except RoundTripError as exc:
            print(f"tiercache-bench: round trip FAILED: {exc}", file=sys.stderr)
            return 1
        except (TierCacheError, OSError, LookupError, ValueError) as exc:
            print(f"tiercache-bench: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    if args.json is not None:
        write_json(report, args.json)
    print(format_report(report))
    return 0


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
    return handler(args)

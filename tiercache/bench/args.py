"""Argument types and flag groups shared by the ``tiercache-bench`` subcommands.

Primitives:
    parse_size / parse_sizes: ``256K``, ``1M``, ``1.5MiB``, ``4096`` -> bytes (binary units).
    parse_levels: ``L1,L3`` -> tier levels.
    parse_codec, parse_device, positive_int, non_negative_int, positive_float, non_negative_float,
        parse_ints, non_negative_ints, enum_choice: argparse ``type=`` converters.
    add_output_flags: ``--json``, ``--plot``, ``-q``.
    add_address_flags / add_policy_flags / add_daemon_flags: where to run, write and eviction policies,
        the sizes of an embedded daemon.
    size_or_zero: a size or 0 (a tier left out).
    daemon_config_from_args: the :class:`~tiercache.testing.embedded.EmbeddedDaemonConfig` of those flags.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from tiercache import parsers
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.testing.embedded import EmbeddedDaemonConfig
from tiercache.tiers.base import TierLevel

E = TypeVar("E", bound=enum.Enum)


def parse_size(text: str) -> int:
    """Bytes in ``text``, positive (:func:`tiercache.parsers.parse_size`: ``256K``, ``1.5MiB``, ``4096``).

    Raises:
        argparse.ArgumentTypeError: not a size, or not a positive whole number of bytes.
    """
    try:
        value = parsers.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of bytes")
    return value


def parse_sizes(text: str) -> tuple[int, ...]:
    """Comma-separated sizes, e.g. ``256K,1M,4M`` (see :func:`parse_size`)."""
    return tuple(parse_size(part) for part in text.split(",") if part.strip())


def parse_ints(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. ``64,256``.

    Raises:
        argparse.ArgumentTypeError: an item is not a positive integer, or the list is empty.
    """
    out = tuple(positive_int(part.strip()) for part in text.split(",") if part.strip())
    if not out:
        raise argparse.ArgumentTypeError("at least one value is needed")
    return out


def non_negative_ints(text: str) -> tuple[int, ...]:
    """Comma-separated non-negative integers, e.g. ``0,50,100``.

    Raises:
        argparse.ArgumentTypeError: an item is not an integer or is negative, or the list is empty.
    """
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: need at least one non-negative integer")
    return values


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


def parse_codec(text: str) -> Codec:
    """An L3 codec name (``raw`` or ``zstd``)."""
    try:
        return Codec.from_name(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def enum_choice(kind: type[E]) -> Callable[[str], E]:
    """An argparse type accepting the values of ``kind`` (the error lists them)."""

    def parse(text: str) -> E:
        for member in kind:
            if str(member.value) == text.strip().lower():
                return member
        valid = ", ".join(str(m.value) for m in kind)
        raise argparse.ArgumentTypeError(f"unknown {kind.__name__} {text!r}; valid: {valid}")

    parse.__name__ = kind.__name__
    return parse


def parse_device(text: str) -> str:
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


def positive_int(text: str) -> int:
    """A positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """A non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """A positive number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A non-negative number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number, got {text}")
    return value


def add_output_flags(p: argparse.ArgumentParser, plot_help: str) -> None:
    """``--json PATH``, ``--plot PATH.png`` and ``-q/--quiet``."""
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every figure as JSON")
    p.add_argument("--plot", type=Path, default=None, metavar="PATH.png", help=plot_help)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def add_address_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--address``, ``--token`` and ``--dir``."""
    g.add_argument("--address", default=None, help="a running daemon: unix:/path or host:port")
    g.add_argument("--token", default=None, help="bearer token of the running daemon, if it needs one")
    g.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="directory for the run's work dir (daemon socket, L3, files); default: the user cache dir",
    )


def add_policy_flags(g: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--write-policy`` and ``--eviction-policy``."""
    g.add_argument(
        "--write-policy",
        type=enum_choice(WritePolicyKind),
        default=WritePolicyKind.WRITE_THROUGH,
        help="write policy: write_through, on_evict, selective or watermark (write_through)",
    )
    g.add_argument(
        "--eviction-policy",
        type=enum_choice(EvictionPolicyKind),
        default=EvictionPolicyKind.ADAPTIVE,
        help="eviction policy: adaptive, lru, lfu or segmented (adaptive)",
    )


def add_daemon_flags(p: argparse.ArgumentParser, l2_default: str = "1G", l3_default: str = "0") -> None:
    """``--address``/``--token`` of a running daemon, else the sizes of the daemon the bench starts."""
    g = p.add_argument_group(
        "daemon",
        "a running daemon (--address), else one started for the run on a temporary unix socket, "
        "with the sizes below, and stopped at exit",
    )
    add_address_flags(g)
    g.add_argument(
        "--daemon-l2-bytes",
        type=parse_size,
        default=parse_size(l2_default),
        metavar="SIZE",
        help=f"embedded daemon: L2 shared-memory capacity ({l2_default})",
    )
    g.add_argument(
        "--daemon-l3-bytes",
        type=size_or_zero,
        default=size_or_zero(l3_default),
        metavar="SIZE",
        help=f"embedded daemon: L3 capacity in the work dir, 0 for no L3 ({l3_default})",
    )
    g.add_argument(
        "--daemon-l1-device",
        default="none",
        help="embedded daemon: L1 device (none, cpu, cuda, auto) (none)",
    )
    g.add_argument(
        "--daemon-l1-bytes",
        type=parse_size,
        default=256 << 20,
        metavar="SIZE",
        help="embedded daemon: L1 capacity (256M)",
    )
    add_policy_flags(g)


def size_or_zero(text: str) -> int:
    """A size (see :func:`parse_size`) or ``0``."""
    return 0 if text.strip() == "0" else parse_size(text)


def daemon_config_from_args(args: argparse.Namespace, slot_bytes: int) -> EmbeddedDaemonConfig:
    """The embedded daemon of :func:`add_daemon_flags`'s flags with ``slot_bytes`` slots."""
    return EmbeddedDaemonConfig(
        slot_bytes=slot_bytes,
        l1_device=args.daemon_l1_device,
        l1_bytes=args.daemon_l1_bytes,
        l2_bytes=args.daemon_l2_bytes,
        l3_bytes=args.daemon_l3_bytes,
        write_policy=args.write_policy,
        eviction_policy=args.eviction_policy,
    )

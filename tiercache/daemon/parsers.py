"""Parsers of the daemon's own option values: TCP addresses, log levels and the L1 device.

Each accepts a string (CLI flag, ``TIERCACHE_*`` variable) or a TOML scalar and raises ``ValueError``, as the
core parsers of :mod:`tiercache.parsers` do.

Primitives:
    parse_tcp, parse_log_level, parse_device: addresses, log levels, devices.
    LOG_LEVELS: valid ``--log-level`` values.
    L1Device: how ``--l1-device`` is spelled (besides ``cuda:N``).
"""

from __future__ import annotations

import enum
import re

from tiercache.parsers import parse_str

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""Valid ``--log-level`` values."""


class L1Device(enum.Enum):
    """The spellings of ``--l1-device`` besides ``cuda:N``."""

    AUTO = "auto"
    NONE = "none"
    CPU = "cpu"
    CUDA = "cuda"


def parse_tcp(raw: object) -> str:
    """``HOST:PORT`` (``[v6addr]:PORT`` for IPv6) or empty for off.

    Raises:
        ValueError: malformed address or port.
    """
    text = parse_str(raw).strip()
    if not text:
        return ""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT (port 0-65535), got {text!r}")
    return text


def parse_log_level(raw: object) -> str:
    """A logging level name.

    Raises:
        ValueError: not one of :data:`LOG_LEVELS`.
    """
    text = parse_str(raw).strip().upper()
    if text not in LOG_LEVELS:
        raise ValueError(f"unknown level {raw!r}; valid: {', '.join(LOG_LEVELS)}")
    return text


def parse_device(raw: object) -> str:
    """``auto``, ``none``, ``cpu``, ``cuda`` or ``cuda:N`` (resolved later, when torch is asked).

    Raises:
        ValueError: none of those.
    """
    text = parse_str(raw).strip().lower()
    if text in {d.value for d in L1Device} or re.fullmatch(r"cuda:\d+", text):
        return text
    raise ValueError(f"expected auto, none, cpu, cuda or cuda:N, got {raw!r}")

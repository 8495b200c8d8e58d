"""Option value parsers: each accepts a string (CLI flag, ``TIERCACHE_*`` variable) or a TOML scalar.

Every parser raises ``ValueError`` with what was wrong; the loader that knows the option turns it into an
error naming the option. Config dataclasses name these parsers in their option declarations
(:mod:`tiercache.options`); ``tiercache-bench`` reads its sizes with the same :func:`parse_size`.

Primitives:
    parse_size, format_size: ``256M``, ``1.5GiB``, ``4096`` <-> bytes (binary units).
    parse_int, parse_float, parse_bool, parse_str, parse_octal: scalars.
    parse_choice: an Enum's values.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

_E = TypeVar("_E", bound=enum.Enum)


def parse_size(raw: object) -> int:
    """A byte size: a non-negative integer, or a string with an optional binary suffix K/M/G/T.

    ``"64K"``, ``"32M"``, ``"2GiB"``, ``"1.5K"``, ``"1t"`` and ``"4096"`` are accepted; a fraction must come
    to a whole number of bytes.

    Raises:
        ValueError: not a size, or not a whole number of bytes.
    """
    if isinstance(raw, bool):
        raise ValueError(f"expected a size such as 512M or 2G, got {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"must not be negative, got {raw}")
        return raw
    if isinstance(raw, str):
        match = _SIZE.match(raw)
        if match:
            value = Fraction(match.group(1)) * _UNITS[match.group(2).lower()]
            if value.denominator != 1:
                raise ValueError(f"{raw!r} is not a whole number of bytes")
            return int(value)
    raise ValueError(f"expected a size such as 512M or 2G (binary K/M/G/T suffixes), got {raw!r}")


def format_size(nbytes: int) -> str:
    """The shortest exact spelling of a size with a binary suffix (``33554432`` -> ``32M``)."""
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def parse_int(raw: object) -> int:
    """An integer (TOML int or decimal string).

    Raises:
        ValueError: not an integer.
    """
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip(), 10)
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {raw!r}")


def parse_float(raw: object) -> float:
    """A finite number (TOML int/float or a string).

    Raises:
        ValueError: not a finite number.
    """
    value: float | None = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {raw!r}")
    return value


def parse_bool(raw: object) -> bool:
    """A boolean: TOML bool, or one of 1/0, true/false, yes/no, on/off.

    Raises:
        ValueError: not a boolean.
    """
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(f"expected true or false, got {raw!r}")


def parse_str(raw: object) -> str:
    """A string (TOML strings only; CLI and environment values are strings already).

    Raises:
        ValueError: not a string.
    """
    if isinstance(raw, str):
        return raw
    raise ValueError(f"expected a string, got {raw!r}")


def parse_octal(raw: object) -> int:
    """A file mode: an octal string (``0600``, ``600``, ``0o600``) or a TOML integer such as ``0o600``.

    Raises:
        ValueError: not a mode in ``[0, 0o777]``.
    """
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str):
        text = raw.strip().lower().removeprefix("0o")
        try:
            value = int(text, 8)
        except ValueError:
            value = None
    if value is None or not 0 <= value <= 0o777:
        raise ValueError(f"expected an octal file mode such as 0600, got {raw!r}")
    return value


def parse_choice(enum_type: type[_E]) -> Callable[[object], _E]:
    """A parser of an Enum's values (case-insensitive); the error lists the valid names."""

    def parse(raw: object) -> _E:
        text = parse_str(raw).strip().lower()
        for member in enum_type:
            if str(member.value).lower() == text:
                return member
        valid = ", ".join(str(m.value) for m in enum_type)
        raise ValueError(f"unknown value {raw!r}; valid: {valid}")

    return parse

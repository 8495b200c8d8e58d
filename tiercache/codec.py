"""How chunk bytes are encoded at rest (L3 values) and in flight (byte streams): one enum for both.

Primitives:
    Codec: RAW or ZSTD; its value is the name used in config files and on command lines.
"""

from __future__ import annotations

import enum

from tiercache.errors import InvalidArgumentError


class Codec(enum.Enum):
    """How a payload is stored. The value is the name used in config files."""

    RAW = "raw"
    ZSTD = "zstd"

    @classmethod
    def from_name(cls, name: str) -> Codec:
        """The codec called ``name`` (case-insensitive).

        Raises:
            InvalidArgumentError: no codec has that name (the message lists the valid names).
        """
        try:
            return cls(name.lower())
        except (ValueError, AttributeError):
            valid = ", ".join(c.value for c in cls)
            raise InvalidArgumentError("codec", f"unknown codec {name!r}; valid: {valid}") from None

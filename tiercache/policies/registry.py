"""The one way a policy name becomes its Enum member: unknown names fail with the list of valid ones.

Primitives:
    parse_kind: an Enum member from itself or its value, or InvalidArgumentError naming the field.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from tiercache.errors import InvalidArgumentError

_E = TypeVar("_E", bound=enum.Enum)


def parse_kind(enum_type: type[_E], value: object, field: str) -> _E:
    """``value`` as a member of ``enum_type`` (a member or its value); else InvalidArgumentError(field)."""
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if member.value == value:
            return member
    valid = ", ".join(str(m.value) for m in enum_type)
    raise InvalidArgumentError(field, f"unknown value {value!r}; valid: {valid}")

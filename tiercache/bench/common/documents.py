"""JSON documents of benchmark runs: common envelope and writing.

Every command's document carries ``schema``, ``command``, ``machine`` (see
:func:`~tiercache.bench.ceilings.describe_machine`), ``config`` and its figures.

Primitives:
    jsonable: dataclasses, enums, paths and tuples -> plain JSON values.
    write_document: write a document to a file (indented, UTF-8).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def jsonable(value: Any) -> Any:
    """A JSON-ready copy of ``value``: dataclasses -> dicts, enums -> values, paths -> strings.

    Non-finite floats (a ratio to a zero ceiling) become None, which JSON can represent.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_document(doc: Mapping[str, Any], path: Path) -> None:
    """Write ``doc`` as indented JSON to ``path``."""
    path.write_text(json.dumps(jsonable(doc), indent=2) + "\n", encoding="utf-8")

"""The work directory of a benchmark run: a fresh temporary directory, removed at the end.

L3 directories, disk ceilings and daemons' files of a run go under it, so that nothing a run writes outlives
it (a ``--dir`` given to a command is where it goes; the directory given is left as it was found).

Primitives:
    default_work_root: where the work directory goes when none is given.
    work_directory: a fresh temporary work directory, removed at exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def default_work_root() -> Path:
    """``$XDG_CACHE_HOME/tiercache-bench`` (or ``~/.cache/...``) if it can be created, else the temp dir."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(cache) / "tiercache-bench"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Path(tempfile.gettempdir())
    return root if os.access(root, os.W_OK) else Path(tempfile.gettempdir())


@contextlib.contextmanager
def work_directory(root: Path | None) -> Iterator[Path]:
    """A fresh temporary directory under ``root`` (default :func:`default_work_root`), removed at exit."""
    base = root if root is not None else default_work_root()
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="tiercache-bench-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

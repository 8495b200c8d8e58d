"""``python -m tiercache.daemon``: the same as ``tiercache-daemon``."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

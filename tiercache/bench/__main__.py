"""``python -m tiercache.bench``: the same as the ``tiercache-bench`` console script."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())

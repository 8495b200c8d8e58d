"""``python -m tiercache.bench.engine``: the ``engine`` benchmark on its own (same flags as the subcommand)."""

from __future__ import annotations

import logging
import sys

from .command import main

logging.basicConfig(level=logging.WARNING)
sys.exit(main())

"""A dependency-free progress bar on stderr for long benchmark runs.

On a terminal the bar is redrawn in place (at most ten times a second); elsewhere (a log file, CI) one line
is printed at each quarter, so that logs stay short. A disabled bar prints nothing.

Primitives:
    ProgressBar: ``with ProgressBar(total, "store", enabled) as bar: ... bar.advance()``.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30
_REDRAW_S = 0.1


class ProgressBar:
    """Counts steps towards a total and shows ``label [#####.....] done/total``.

    Attributes:
        total: steps expected (at least 1).
        label: what is being done.
        done: steps done so far.
    """

    def __init__(self, total: int, label: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        """Prepare a bar (nothing is drawn until the first step).

        Args:
            total: steps expected; values below 1 count as 1.
            label: shown before the bar.
            enabled: False for a silent bar.
            stream: where to draw; default ``sys.stderr``.
        """
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self._enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._last_quarter = 0

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more steps and redraw when due."""
        self.done = min(self.total, self.done + steps)
        if not self._enabled:
            return
        if self._tty:
            now = time.monotonic()
            if now - self._last_draw >= _REDRAW_S or self.done == self.total:
                self._last_draw = now
                self._stream.write("\r" + self._line())
                self._stream.flush()
            return
        quarter = 4 * self.done // self.total
        if quarter > self._last_quarter:
            self._last_quarter = quarter
            self._stream.write(self._line() + "\n")
            self._stream.flush()

    def close(self) -> None:
        """End the bar's line (on a terminal)."""
        if self._enabled and self._tty and self.done:
            self._stream.write("\n")
            self._stream.flush()

    def _line(self) -> str:
        filled = _WIDTH * self.done // self.total
        return f"tiercache-bench: {self.label} [{'#' * filled}{'.' * (_WIDTH - filled)}] {self.done}/{self.total}"

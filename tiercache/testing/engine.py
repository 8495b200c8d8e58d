"""An engine subprocess and its one line protocol, both sides (standard library only, so that an engine
running as another user, with a copy of the package and no torch, can import it).

The protocol:

- the parent starts the engine and writes its parameters as one JSON line on its stdin (stdin stays open);
- the engine reads them (:func:`read_params`) and says things as lines ``TIERCACHE-ENGINE <json>`` on its
  stdout (:func:`say`); other stdout lines (an engine library's own logging) are not messages;
- the parent may send further lines (:meth:`EngineProcess.tell`; the engine reads them with
  :func:`next_line`, which is ``""`` once the parent closed stdin);
- the engine's last message is its result; it exits 0. Its stderr goes to a log file.

The parent side, :class:`EngineProcess`, reads stdout on a thread, so that waiting for a message has a
deadline and never blocks on an engine that hangs; ``result`` closes stdin and waits for the exit, ``kill``
is SIGKILL (engines holding leases are killed on purpose), ``stop`` closes stdin and kills after a bounded
wait.

Primitives:
    MARK: the prefix of a message line.
    read_params / say / next_line: the engine's side.
    EngineError: the engine exited, failed or said nothing in time (with its stderr's tail).
    EngineProcess: the parent's side.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MARK = "TIERCACHE-ENGINE "
"""Prefix of a message line on the engine's stdout."""
MESSAGE_TIMEOUT_S = 600.0
"""Default wait for a message (many engines importing torch at once on a small host are slow)."""
STOP_TIMEOUT_S = 30.0
_OUTPUT_LINES = 50


def read_params() -> dict[str, Any]:
    """The engine's parameters: the first line of its stdin."""
    params: dict[str, Any] = json.loads(sys.stdin.readline())
    return params


def say(message: Mapping[str, Any]) -> None:
    """Send one message to the parent."""
    print(MARK + json.dumps(message), flush=True)


def next_line() -> str:
    """The parent's next line (stripped); ``""`` once it closed stdin."""
    return sys.stdin.readline().strip()


class EngineError(RuntimeError):
    """The engine exited, failed or said nothing in time."""


class EngineProcess:
    """One engine subprocess speaking the line protocol."""

    def __init__(
        self,
        argv: Sequence[str],
        params: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stderr_path: Path | None = None,
    ) -> None:
        """Start ``argv`` and send it ``params``.

        Args:
            argv: the command (e.g. ``[sys.executable, "-m", "tiercache.testing.faults.engine"]``).
            params: its parameters (JSON-able).
            env: its environment (None: this process's).
            cwd: its working directory.
            stderr_path: where its stderr goes (a temporary file, removed by :meth:`close`, if None).
        """
        self._own_stderr = stderr_path is None
        if stderr_path is None:
            fd, name = tempfile.mkstemp(prefix="tiercache-engine-", suffix=".log")
            os.close(fd)
            stderr_path = Path(name)
        self.stderr_path = stderr_path
        with stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=None if env is None else dict(env),
                cwd=cwd,
            )
        self.output: deque[str] = deque(maxlen=_OUTPUT_LINES)
        """The latest stdout lines that were not messages."""
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"engine-{self.proc.pid}", daemon=True)
        self._reader.start()
        with contextlib.suppress(BrokenPipeError):  # it exited at once: message() and result() say so
            self.tell(json.dumps(dict(params)))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(MARK):
                self._messages.put(json.loads(line[len(MARK) :]))
            else:
                self.output.append(line)
        self._messages.put(None)

    @property
    def pid(self) -> int:
        """Its process id."""
        return self.proc.pid

    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def _failure(self, what: str) -> EngineError:
        out = "\n".join(self.output)
        err = self.stderr()[-5000:]
        return EngineError(f"engine {self.proc.pid} {what}\nstdout:\n{out[-3000:]}\nstderr:\n{err}")

    def message(self, timeout_s: float = MESSAGE_TIMEOUT_S) -> dict[str, Any]:
        """Its next message.

        Raises:
            EngineError: it exited, or said nothing within ``timeout_s``.
        """
        try:
            message = self._messages.get(timeout=timeout_s)
        except queue.Empty:
            raise self._failure(f"said nothing within {timeout_s:.0f}s") from None
        if message is None:
            self._messages.put(None)  # stays at the end for later calls
            raise self._failure(f"exited with {self.proc.wait(STOP_TIMEOUT_S)}")
        return message

    def tell(self, line: str) -> None:
        """Write one line to its stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def wait(self, timeout_s: float = MESSAGE_TIMEOUT_S) -> int:
        """Close its stdin and wait for it to exit; its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout_s)

    def result(self, timeout_s: float = MESSAGE_TIMEOUT_S) -> dict[str, Any]:
        """Close its stdin, wait for it to exit and return its last message.

        Raises:
            EngineError: it failed (non-zero exit) or said nothing.
        """
        try:
            code = self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._failure(f"did not finish within {timeout_s:.0f}s") from None
        self._reader.join(STOP_TIMEOUT_S)
        messages = []
        with contextlib.suppress(queue.Empty):  # (a reader still blocked on a grandchild's stdout)
            while (message := self._messages.get_nowait()) is not None:
                messages.append(message)
            self._messages.put(None)  # stays at the end for later calls
        if code != 0 or not messages:
            raise self._failure(f"exited with {code} after {len(messages)} message(s)")
        return messages[-1]

    def kill(self) -> None:
        """SIGKILL and reap (nothing if it has exited)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)

    def close(self) -> None:
        """Kill it if it still runs, close its pipes and remove a temporary stderr file."""
        self.kill()
        self._reader.join(STOP_TIMEOUT_S)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        if self._own_stderr:
            self.stderr_path.unlink(missing_ok=True)

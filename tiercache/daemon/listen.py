"""The unix socket's file: its directory, a stale file left by a dead daemon, its mode, its removal.

gRPC replaces an existing socket file when it binds, so the daemon first checks whether a daemon still
answers on the path: if one does, starting a second one is an error; if none does, the file is stale and
removed.

Primitives:
    StartupError: the daemon cannot start (another one is running, a path is unusable, a bind failed).
    prepare_socket_path: create the directory (0700) and remove a stale socket file.
    restrictive_umask: a context in which new files get no group/other bits (for the bind).
    SocketFile: the bound socket's path and identity; ``chmod`` and ``remove`` (only if it is still ours).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0
"""How long the check for a live daemon on an existing socket file may take."""


class StartupError(RuntimeError):
    """The daemon cannot start; the message says why and what to do."""


def prepare_socket_path(path: str) -> None:
    """Make ``path`` bindable: create its directory (mode 0700) and remove a stale socket file.

    Raises:
        StartupError: a daemon answers on ``path``, or ``path`` is something other than a socket, or the
            directory cannot be created.
    """
    parent = Path(path).parent
    if not parent.exists():
        try:
            parent.mkdir(mode=0o700, parents=True)
            os.chmod(parent, 0o700)
        except OSError as exc:
            raise StartupError(f"--socket: cannot create {parent}: {exc.strerror or exc}") from None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"--socket: {path} exists and is not a socket; remove it or choose another path")
    if _answers(path):
        raise StartupError(
            f"--socket: another daemon is listening on {path}; stop it first or choose another --socket"
        )
    logger.warning("removing stale socket file %s (no daemon answers on it)", path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _answers(path: str) -> bool:
    """Whether something accepts connections on the unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        # A listener with a full backlog times out or says EAGAIN: it is alive.
        return exc.errno in (errno.EAGAIN, errno.ETIMEDOUT) or isinstance(exc, TimeoutError)
    finally:
        probe.close()
    return True


@contextlib.contextmanager
def restrictive_umask() -> Iterator[None]:
    """New files created inside get mode bits for their owner only (the socket file before its chmod)."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


@dataclass(frozen=True, slots=True)
class SocketFile:
    """A bound unix socket file.

    Attributes:
        path: its path.
        inode: its inode when bound; another file at the same path later is not ours.
    """

    path: str
    inode: int

    @classmethod
    def bound(cls, path: str) -> SocketFile:
        """The socket file just bound at ``path``."""
        return cls(path, os.stat(path).st_ino)

    def chmod(self, mode: int) -> None:
        """Set the socket file's permission bits."""
        os.chmod(self.path, mode)

    def remove(self) -> None:
        """Unlink the socket file if it is still the one bound (idempotent)."""
        try:
            if os.lstat(self.path).st_ino != self.inode:
                return
            os.unlink(self.path)
        except FileNotFoundError:
            return
        logger.info("removed socket file %s", self.path)

"""The unix sockets' files: their directory, a stale file left by a dead daemon, their mode, their removal.

gRPC replaces an existing socket file when it binds, so the daemon first checks whether a daemon still
answers on the path: if one does, starting a second one is an error; if none does, the file is stale and
removed.

The directory is where another local user would squat: whoever can write in it can put its own listener at
``daemon.sock.fd`` (or ``daemon.sock``) and receive the engines' tokens and grants. So the daemon uses only a
directory that is its own: an existing one that is a symbolic link, not a directory, owned by another uid or
writable by group or others is refused (a :class:`StartupError` naming it), and so is one whose ancestors
another (non-root) user could rename it out of. The socket files get their mode at bind (under a umask
that leaves exactly those bits), and are then checked through a descriptor of the file itself
(``O_PATH | O_NOFOLLOW``): nothing follows a symbolic link.

Primitives:
    StartupError: the daemon cannot start (another one is running, a path is unusable, a bind failed).
    prepare_socket_path: create the directory (0700) or check an existing one; remove a stale socket file.
    check_socket_dir: the ownership and mode checks of a socket directory.
    socket_umask: a context in which a new socket file gets exactly the given mode.
    bind_unix_socket: bind and check a unix socket at a path (the daemon's own sockets besides gRPC's).
    SocketFile: a bound socket file's path and inode; ``check`` (mode, no symlink), ``remove`` (if ours).
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
    """Make ``path`` bindable: create its directory (mode 0700) or check the existing one, and remove a
    stale socket file.

    Raises:
        StartupError: the directory is not the daemon's own (:func:`check_socket_dir`) or cannot be created,
            a daemon answers on ``path``, or ``path`` is something other than a socket.
    """
    parent = Path(path).parent
    if not os.path.lexists(parent):
        try:
            with socket_umask(0o700):
                parent.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass  # made meanwhile: checked below like any existing one
        except OSError as exc:
            raise StartupError(f"--socket: cannot create {parent}: {exc.strerror or exc}") from None
    check_socket_dir(parent)
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


def check_socket_dir(directory: Path) -> None:
    """Refuse a socket directory another user could squat.

    ``directory`` must be a real directory (not a symbolic link) owned by this process's uid and not writable
    by group or others; each of its ancestors must be owned by root or this uid and, when group- or
    other-writable, sticky (as ``/tmp`` is), so that nobody else can rename it away.

    Raises:
        StartupError: naming the directory and what is wrong with it.
    """
    uid = os.geteuid()
    fix = f"remove it or choose another --socket (its directory must be owned by uid {uid}, mode 0700)"
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise StartupError(f"--socket: cannot check {directory}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StartupError(f"--socket: refusing socket directory {directory}: it is a symbolic link; {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise StartupError(f"--socket: refusing socket directory {directory}: not a directory; {fix}")
    if st.st_uid != uid:
        raise StartupError(
            f"--socket: refusing socket directory {directory}: owned by uid {st.st_uid}, not this daemon's "
            f"uid {uid} (another user could put its own listener there); {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StartupError(
            f"--socket: refusing socket directory {directory}: writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}; another user could put its own listener there); {fix}"
        )
    for ancestor in directory.absolute().parents:
        try:
            up = os.stat(ancestor)
        except OSError as exc:
            raise StartupError(f"--socket: cannot check {ancestor}: {exc.strerror or exc}") from None
        writable = up.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not up.st_mode & stat.S_ISVTX
        if up.st_uid not in (0, uid) or writable:
            raise StartupError(
                f"--socket: refusing socket directory {directory}: its ancestor {ancestor} (uid {up.st_uid}, "
                f"mode {stat.S_IMODE(up.st_mode):04o}) lets another user rename it; {fix}"
            )


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
def socket_umask(mode: int) -> Iterator[None]:
    """New files created inside get at most ``mode``'s permission bits (a unix socket file: exactly them)."""
    old = os.umask(0o777 & ~mode)
    try:
        yield
    finally:
        os.umask(old)


def bind_unix_socket(path: str, mode: int) -> tuple[socket.socket, SocketFile]:
    """A stream socket bound at ``path`` with file mode ``mode`` (a stale socket file there is replaced).

    The directory must have passed :func:`prepare_socket_path`.

    Raises:
        StartupError: something other than a socket is at ``path``, or the bound file is not as asked.
        OSError: the bind failed.
    """
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(
                f"--socket: {path} exists and is not a socket; remove it or choose another path"
            )
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_umask(mode):
            sock.bind(path)
        return sock, SocketFile.bound(path, mode)
    except BaseException:
        sock.close()
        raise


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
    def bound(cls, path: str, mode: int) -> SocketFile:
        """The socket file just bound at ``path``, checked to be a socket (not a link to one) of ``mode``.

        Its mode is set through a descriptor of the file itself when the umask of the bind did not give it.

        Raises:
            StartupError: ``path`` is not a socket file.
        """
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StartupError(
                f"--socket: cannot open the bound socket {path}: {exc.strerror or exc}"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode):
                raise StartupError(f"--socket: {path} is not the socket just bound; refusing to use it")
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(f"/proc/self/fd/{fd}", mode)  # the inode the descriptor holds, never a link
        finally:
            os.close(fd)
        return cls(path, st.st_ino)

    def remove(self) -> None:
        """Unlink the socket file if it is still the one bound (idempotent)."""
        try:
            if os.lstat(self.path).st_ino != self.inode:
                return
            os.unlink(self.path)
        except FileNotFoundError:
            return
        logger.info("removed socket file %s", self.path)

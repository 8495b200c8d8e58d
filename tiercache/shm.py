"""Shared-memory segments that another process can map: named (Linux ``/dev/shm``) or anonymous (memfd).

The daemon creates one named segment for the default L2 pool; same-host engines attach to it by name and
copy KV straight into or out of its slots. Segments are named ``<prefix>.<owner pid>.<random>`` so that a
restarting owner can find and unlink the segments a dead owner left behind.

A tenant's pool is an anonymous segment (``memfd_create``): it has no name anywhere, so no other process can
open it; only a process the daemon hands the file descriptor to (over a unix socket, see
:mod:`tiercache.fdpass`) can map it. It is sealed at creation (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``):
an engine holding the descriptor can write its bytes but can neither shrink it (which would leave the
daemon's mapping past the end of the file: SIGBUS on the daemon's next touch) nor grow it, nor lift the seals.

Python's ``multiprocessing.shared_memory`` is not used: its resource tracker unlinks segments it did not
create when an attaching process exits, which would pull the pool out from under the daemon.

Primitives:
    SharedSegment.create / SharedSegment.attach: make or map a named segment; ``buffer`` is a writable
        memoryview of it; ``close`` unmaps; ``unlink`` removes the name.
    SharedSegment.create_anonymous / SharedSegment.from_fd: make a sparse sealed memfd segment (``fd`` is
        what is handed out) / map one received as a file descriptor.
    REQUIRED_SEALS / is_sealed: the seals every descriptor the daemon hands out carries / whether it does.
    SharedSegment.populate / SharedSegment.release: fault in / give back the pages of a byte range.
    SharedSegment.map_in: map the existing pages of a byte range into this process, writing nothing.
    clean_stale_segments: unlink segments of a prefix whose owner process is gone.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import secrets
from pathlib import Path

from tiercache.errors import InvalidArgumentError, NotFoundError

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_PAGE = mmap.PAGESIZE
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
"""Seals of a segment handed out: its size can never change again, and the seals cannot be lifted."""


def is_sealed(fd: int) -> bool:
    """Whether ``fd`` is a memfd whose size no holder can change (it carries every :data:`REQUIRED_SEALS`)."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        return False
    return seals & REQUIRED_SEALS == REQUIRED_SEALS


def _check_name(field: str, name: str) -> None:
    if not name or "/" in name or name.startswith(".") or len(name) > 200:
        raise InvalidArgumentError(field, f"{name!r} is not a valid shared-memory name")


class SharedSegment:
    """A mapped shared-memory segment.

    Attributes:
        name: the segment's name (a file under ``/dev/shm``).
        size: mapped bytes.
        owner: True for the process that created it (and is responsible for unlinking it).
    """

    def __init__(self, name: str, mm: mmap.mmap, size: int, owner: bool, fd: int | None = None) -> None:
        self.name = name
        self.size = size
        self.owner = owner
        self._fd = fd
        self._mmap: mmap.mmap | None = mm
        self._view: memoryview | None = memoryview(mm)

    @classmethod
    def create_anonymous(cls, label: str, size: int) -> SharedSegment:
        """Create a sparse, sealed anonymous segment (``memfd_create``; no pages until touched, no name
        anywhere; its size is sealed before this returns, so before any descriptor of it can leave).

        Args:
            label: shown in ``/proc/<pid>/fd`` and used in logs (``name`` is ``memfd:<label>``).
            size: bytes; positive.

        Raises:
            InvalidArgumentError: bad label or size.
        """
        _check_name("label", label)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError("size", f"must be a positive integer, got {size!r}")
        fd = os.memfd_create(label, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        logger.info("created anonymous shared-memory segment %s (%d bytes, sparse)", label, size)
        return cls(f"memfd:{label}", mm, size, owner=True, fd=fd)

    @classmethod
    def from_fd(cls, name: str, fd: int) -> SharedSegment:
        """Map a segment received as a file descriptor (the descriptor is closed once mapped).

        Raises:
            OSError: the descriptor cannot be mapped.
        """
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, mm, size, owner=False)

    @property
    def fd(self) -> int:
        """The file descriptor of an anonymous segment this process created (what is handed to engines).

        Raises:
            ValueError: a named or attached segment (those have none), or a closed one.
        """
        if self._fd is None:
            raise ValueError(f"segment {self.name} has no file descriptor to hand out")
        return self._fd

    def populate(self, offset: int, length: int) -> None:
        """Fault in the pages of ``[offset, offset + length)`` (rounded out to whole pages)."""
        if self._mmap is not None:
            start = offset - offset % _PAGE
            _populate_range(self._mmap, start, min(self.size, offset + length) - start)

    def map_in(self, offset: int, length: int) -> None:
        """Set up this process's page-table entries for the pages of ``[offset, offset + length)`` without
        writing a byte (MADV_POPULATE_READ, else a read per page): another process's segment whose pages
        exist, mapped here, costs a page fault per 4 KiB page on first access; this takes them ahead."""
        if self._mmap is None:
            return
        start = offset - offset % _PAGE
        length = min(self.size, offset + length) - start
        if length <= 0:
            return
        try:
            self._mmap.madvise(_MADV_POPULATE_READ, start, length)
        except (OSError, ValueError):
            view = memoryview(self._mmap)
            try:
                sum(view[start : start + length : _PAGE])
            finally:
                view.release()

    def release(self, offset: int, length: int) -> None:
        """Give back the whole pages inside ``[offset, offset + length)``; they read as zeros afterwards."""
        start = -(-offset // _PAGE) * _PAGE
        stop = (offset + length) // _PAGE * _PAGE
        if self._mmap is not None and stop > start:
            try:
                self._mmap.madvise(mmap.MADV_REMOVE, start, stop - start)
            except OSError as exc:  # pragma: no cover - tmpfs and memfd both support it
                logger.debug("MADV_REMOVE on %s failed: %s", self.name, exc)

    @classmethod
    def create(cls, prefix: str, size: int, prefault: bool = True) -> SharedSegment:
        """Create a new segment named after ``prefix``, this process and a random suffix (mode 0600).

        Args:
            prefix: name prefix, e.g. ``tiercache-l2``; shared with :func:`clean_stale_segments`.
            size: bytes; positive.
            prefault: populate every page now so that the first copy into it runs at memory speed.

        Raises:
            InvalidArgumentError: bad prefix or size.
            OSError: the system refused the segment (e.g. ``/dev/shm`` too small).
        """
        _check_name("prefix", prefix)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError("size", f"must be a positive integer, got {size!r}")
        name = f"{prefix}.{os.getpid()}.{secrets.token_hex(4)}"
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            if prefault:
                # Reserve the backing pages up front: a full /dev/shm fails here, not later with SIGBUS.
                os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        if prefault:
            _populate(mm, size)
        logger.info("created shared-memory segment %s (%d bytes)", name, size)
        return cls(name, mm, size, owner=True)

    @classmethod
    def attach(cls, name: str) -> SharedSegment:
        """Map an existing segment by name.

        Raises:
            NotFoundError: no segment of that name exists.
        """
        _check_name("name", name)
        try:
            fd = os.open(SHM_DIR / name, os.O_RDWR)
        except FileNotFoundError:
            raise NotFoundError("name", f"no shared-memory segment {name!r}") from None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, mm, size, owner=False)

    @property
    def buffer(self) -> memoryview:
        """Writable view of the whole segment.

        Raises:
            ValueError: the segment is closed.
        """
        if self._view is None:
            raise ValueError(f"shared-memory segment {self.name} is closed")
        return self._view

    def close(self) -> None:
        """Unmap the segment (idempotent). If views of it are still alive the mapping lives on until they die."""
        view, mm, fd = self._view, self._mmap, self._fd
        self._view = self._mmap = None
        self._fd = None
        if fd is not None:
            os.close(fd)
        if view is not None:
            view.release()
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                logger.warning(
                    "segment %s still has live views; it is unmapped when they are released", self.name
                )

    def unlink(self) -> None:
        """Remove the segment's name (idempotent; nothing for an anonymous one); existing mappings stay valid."""
        if self.name.startswith("memfd:"):
            return
        try:
            os.unlink(SHM_DIR / self.name)
            logger.info("unlinked shared-memory segment %s", self.name)
        except FileNotFoundError:
            pass


def _populate(mm: mmap.mmap, size: int) -> None:
    """Fault in every page of a fresh mapping (MADV_POPULATE_WRITE, else touch one byte per page)."""
    try:
        mm.madvise(_MADV_POPULATE_WRITE, 0, size)
    except (OSError, ValueError):
        view = memoryview(mm)
        try:
            for offset in range(0, size, _PAGE):
                view[offset] = 0
        finally:
            view.release()


def _populate_range(mm: mmap.mmap, start: int, length: int) -> None:
    """Fault in the pages of one range of a mapping (MADV_POPULATE_WRITE, else a write per page)."""
    if length <= 0:
        return
    try:
        mm.madvise(_MADV_POPULATE_WRITE, start, length)
    except (OSError, ValueError):
        view = memoryview(mm)
        try:
            for offset in range(start, start + length, _PAGE):
                view[offset] = view[offset]
        finally:
            view.release()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_segments(prefix: str) -> list[str]:
    """Unlink segments named ``<prefix>.<pid>.*`` whose owner process no longer exists.

    Returns:
        Names of the segments removed.
    """
    _check_name("prefix", prefix)
    removed: list[str] = []
    if not SHM_DIR.is_dir():
        return removed
    for path in SHM_DIR.glob(f"{prefix}.*.*"):
        parts = path.name[len(prefix) + 1 :].split(".")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        pid = int(parts[0])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        logger.warning("removed stale shared-memory segment %s of dead process %d", path.name, pid)
        removed.append(path.name)
    return removed

"""Small real filesystems for the full-disk tests: a tmpfs of a given size, or a loop-mounted ext4.

Mounting needs root (CI runs as root); where it is refused the test is skipped with the reason. Each mount
is unmounted at teardown (lazily, so that a test that failed with files open still cleans up).

Primitives:
    mount_tmpfs: a context manager mounting a tmpfs of ``size_bytes`` at a directory.
    mount_ext4: the same with an ext4 filesystem in a loop-mounted image file (needs ``mkfs.ext4``).
    fill: write a filler file until the filesystem is full; returns its path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


def _mount(args: list[str], where: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (CI runs as root)")
    where.mkdir(parents=True, exist_ok=True)
    done = _run("mount", *args, str(where))
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} refused: {done.stderr.strip()}")


@contextlib.contextmanager
def mount_tmpfs(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` for the duration of the block."""
    _mount(["-t", "tmpfs", "-o", f"size={size_bytes}", "tiercache-test"], where)
    try:
        yield where
    finally:
        _run("umount", "-l", str(where))


@contextlib.contextmanager
def mount_ext4(where: Path, image: Path, size_bytes: int) -> Iterator[Path]:
    """An ext4 filesystem of ``size_bytes`` in ``image``, loop-mounted at ``where``."""
    mkfs = shutil.which("mkfs.ext4")
    if mkfs is None:
        pytest.skip("mkfs.ext4 is not installed")
    with open(image, "wb") as f:
        f.truncate(size_bytes)
    made = _run(mkfs, "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    _mount(["-o", "loop", str(image)], where)
    try:
        yield where
    finally:
        _run("umount", "-l", str(where))


def fill(directory: Path, block_bytes: int = 64 << 10) -> Path:
    """Write a filler file in ``directory`` until the filesystem has no free block left."""
    path = directory / "filler"
    block = b"\xa5" * block_bytes
    with open(path, "wb", buffering=0) as f:
        size = block_bytes
        while size >= 512:
            try:
                f.write(block[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2
    return path

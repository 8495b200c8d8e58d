"""Free C-heap pages go back to the system: a heap whose freed blocks lie under a live one shrinks."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tiercache.heaptrim import release_free_heap

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_freed_heap_blocks_under_a_live_one_are_given_back() -> None:
    blocks = [bytearray(64 << 10) for _ in range(1024)]  # 64 MiB of heap blocks (under the mapping threshold)
    pin = bytearray(64 << 10)  # a live block above them: freeing them cannot shrink the heap from the top
    del blocks
    before = _rss_anon()
    assert release_free_heap()
    assert before - _rss_anon() >= 32 << 20
    assert len(pin) == 64 << 10


@pytest.mark.skipif(GLIBC, reason="only where the C library is not glibc")
def test_without_glibc_nothing_is_done() -> None:
    assert not release_free_heap()

"""The machine's own ceilings, measured in the same run as the tiers, and a description of the machine.

A tier figure means little alone: it is reported as a ratio to what the machine can do at best with the
same chunk size and batching.

Primitives:
    CeilingKind: memcpy, buffered disk write (final fsync included), disk read, bare gRPC echo stream.
    CeilingResult: one ceiling at one chunk size.
    measure_memcpy: copy of every chunk into a preallocated destination, batch by batch (on the CPU the
        faster of torch's copy and numpy's one-thread copy).
    measure_disk: write a file of the payload in chunk-size blocks + fsync, drop it from the page cache,
        read it back in chunk-size blocks.
    MachineInfo / describe_machine: CPU count, platform, versions, device and the work dir's filesystem.
"""

from __future__ import annotations

import enum
import logging
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .common.payload import batch_ranges
from .common.timing import Timing, time_calls

logger = logging.getLogger(__name__)

DISK_DEVICE = "disk"
"""The ``device`` of disk ceilings."""


class CeilingKind(enum.Enum):
    """What a ceiling measures. The value is its name in the table and the JSON."""

    MEMCPY = "memcpy"
    DISK_WRITE = "disk_write"
    DISK_READ = "disk_read"
    STREAM_SINK = "stream_sink"
    STREAM_SOURCE = "stream_source"
    REDIS_SET = "redis_set"
    REDIS_GET = "redis_get"
    LMDB_GET = "lmdb_get"
    PINNED_H2D = "pinned_h2d"


@dataclass(frozen=True, slots=True)
class CeilingResult:
    """One ceiling at one chunk size.

    Attributes:
        kind: what was measured.
        device: torch device of a memcpy (``cpu``, ``cuda:0``), or ``disk``.
        chunk_bytes: bytes per chunk (a copy or a ``write``/``read`` call moves one chunk).
        timing: throughput and per-call (per-batch) latency.
        note: how it was measured, when that matters (e.g. whether the page cache was dropped).
    """

    kind: CeilingKind
    device: str
    chunk_bytes: int
    timing: Timing
    note: str = ""

    @property
    def label(self) -> str:
        """Short name, e.g. ``memcpy(cpu)`` or ``disk_write``."""
        return self.kind.value if self.device == DISK_DEVICE else f"{self.kind.value}({self.device})"


def _copy_batch(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor]) -> None:
    for src, dst in zip(srcs, dsts, strict=True):
        dst.copy_(src)


def _copyto_batch(srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray]) -> None:
    for src, dst in zip(srcs, dsts, strict=True):
        np.copyto(dst, src)


def measure_memcpy(
    srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], batch: int, warmup_rounds: int = 1
) -> CeilingResult:
    """Time the copy of every chunk into a preallocated destination, ``batch`` chunks per timed call.

    On the CPU the copy is timed twice, with ``torch`` ``copy_`` and with numpy's ``copyto`` (one thread),
    and the faster pass is the ceiling: torch splits a large copy over its intra-op threads, which is
    faster on an idle host and several times slower when other processes hold the cores; a ceiling must
    be the best the machine does at that moment, not whichever copy happened to stall.

    Args:
        srcs: source chunks (1-D uint8, equal sizes, one device).
        dsts: preallocated destinations of the same sizes on the same device.
        batch: chunks per timed call.
        warmup_rounds: untimed passes first (thread pools and caches warm up as for the tiers).

    Returns:
        The memcpy ceiling on the chunks' device (its note names the faster copy on the CPU).
    """
    device = srcs[0].device
    ranges = batch_ranges(len(srcs), batch)
    ways = {
        "torch copy_": [partial(_copy_batch, srcs[r.start : r.stop], dsts[r.start : r.stop]) for r in ranges]
    }
    if device.type == "cpu":
        src_np, dst_np = [s.numpy() for s in srcs], [d.numpy() for d in dsts]
        ways["numpy copyto"] = [
            partial(_copyto_batch, src_np[r.start : r.stop], dst_np[r.start : r.stop]) for r in ranges
        ]
    for _ in range(warmup_rounds):
        for calls in ways.values():
            for call in calls:
                call()
    total = sum(s.numel() for s in srcs)
    timings = {way: time_calls(calls, total, device) for way, calls in ways.items()}
    way = min(timings, key=lambda w: timings[w].seconds)
    note = f"faster of {' and '.join(timings)}: {way}" if len(timings) > 1 else ""
    return CeilingResult(CeilingKind.MEMCPY, str(device), int(srcs[0].numel()), timings[way], note)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _read_all(fd: int, buf: memoryview) -> None:
    while buf:
        got = os.readv(fd, [buf])
        if got == 0:
            raise OSError(f"short read: {len(buf)} bytes missing at end of file")
        buf = buf[got:]


def _write_batch(fd: int, chunks: Sequence[np.ndarray]) -> None:
    for chunk in chunks:
        _write_all(fd, chunk.data)


def _read_batch(fd: int, bufs: Sequence[np.ndarray]) -> None:
    for buf in bufs:
        _read_all(fd, buf.data)


def _drop_page_cache(fd: int) -> bool:
    """Ask the kernel to drop a (clean, fsynced) file's pages; False where that is not available."""
    advise = getattr(os, "posix_fadvise", None)
    dontneed = getattr(os, "POSIX_FADV_DONTNEED", None)
    if advise is None or dontneed is None:
        return False
    try:
        advise(fd, 0, 0, dontneed)
    except OSError as exc:
        logger.warning("posix_fadvise(DONTNEED) failed: %s", exc)
        return False
    return True


def measure_disk(
    srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], directory: Path, batch: int
) -> tuple[CeilingResult, CeilingResult]:
    """Buffered sequential write then read of one file of all chunks, in chunk-size blocks.

    The write phase ends with one fsync, included in its throughput (but in no call's latency). Before the
    read the file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``), so that the read
    comes from the device where the kernel allows it. The file is removed afterwards.

    Args:
        srcs: CPU source chunks (1-D uint8, equal sizes).
        dsts: preallocated CPU destinations of the same sizes.
        directory: where to put the file (the filesystem the L3 tier uses).
        batch: chunks per timed call.

    Returns:
        ``(disk_write, disk_read)`` ceilings.

    Raises:
        OSError: the file could not be written or read back in full.
    """
    chunk_bytes = int(srcs[0].numel())
    total = sum(s.numel() for s in srcs)
    src_np = [s.numpy() for s in srcs]
    dst_np = [d.numpy() for d in dsts]
    ranges = batch_ranges(len(srcs), batch)
    path = directory / f"disk-ceiling-{chunk_bytes}.bin"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            calls = [partial(_write_batch, fd, src_np[r.start : r.stop]) for r in ranges]
            write = time_calls(calls, total, torch.device("cpu"), finish=partial(os.fsync, fd))
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            dropped = _drop_page_cache(fd)
            calls = [partial(_read_batch, fd, dst_np[r.start : r.stop]) for r in ranges]
            read = time_calls(calls, total, torch.device("cpu"))
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    read_note = "page cache dropped first (fadvise DONTNEED)" if dropped else "page cache NOT dropped (hot)"
    return (
        CeilingResult(
            CeilingKind.DISK_WRITE, DISK_DEVICE, chunk_bytes, write, "buffered writes + final fsync"
        ),
        CeilingResult(CeilingKind.DISK_READ, DISK_DEVICE, chunk_bytes, read, read_note),
    )


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What the figures were measured on.

    Attributes:
        cpu_count: logical CPUs.
        platform: ``platform.platform()``.
        python: Python version.
        torch: torch version.
        torch_threads: torch intra-op threads during the run.
        numpy: numpy version.
        device: the L1 device (``cpu`` or a CUDA device) and, for CUDA, its name.
        memory_bytes: physical memory, 0 if unknown.
        work_dir: directory of the L3 tier and the disk ceiling.
        filesystem: type and mount point of ``work_dir``'s filesystem (from ``/proc/mounts``).
    """

    cpu_count: int
    platform: str
    python: str
    torch: str
    torch_threads: int
    numpy: str
    device: str
    memory_bytes: int
    work_dir: str
    filesystem: str


def filesystem_of(path: Path) -> str:
    """``"<type> on <mount point>"`` for the filesystem holding ``path``, or ``"unknown"``."""
    target = str(path.resolve())
    best = ("", "unknown")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return "unknown" if not best[0] else f"{best[1]} on {best[0]}"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def describe_machine(device: torch.device, work_dir: Path) -> MachineInfo:
    """Describe this machine, the L1 device and the filesystem of ``work_dir``."""
    name = str(device)
    if device.type == "cuda":
        name = f"{device} ({torch.cuda.get_device_name(device)})"
    return MachineInfo(
        cpu_count=os.cpu_count() or 0,
        platform=platform.platform(),
        python=sys.version.split()[0],
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        numpy=np.__version__,
        device=name,
        memory_bytes=_memory_bytes(),
        work_dir=str(work_dir),
        filesystem=filesystem_of(work_dir),
    )

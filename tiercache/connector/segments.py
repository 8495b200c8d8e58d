"""The daemon's shared-memory segments mapped into the engine process (what the same-host data plane uses).

A segment is mapped by name, or (the isolated data plane: a tenant's own anonymous pool) from the file
descriptor the daemon hands out on its fd socket for the registration's one-time grant
(:mod:`tiercache.fdpass`). It is mapped once (per segment name) and wrapped in one ``uint8`` tensor; a slot is a slice of it, so
copies go straight between the daemon's slot and the engine's tensors. Views are only handed out inside
:meth:`SlotMapping.use`; the mapping is unmapped when it is retired and no ``use`` is active, so a view can
never outlive the memory under it. :class:`SegmentMaps` is a client's cache of mappings by segment name.

With CUDA present, a named segment (the daemon's default L2, which the daemon pins in its own process) is
registered as pinned memory in this process too (:mod:`tiercache.pinning`), so the engine's host-to-device
copies out of it are DMA at the link's pinned peak and can be queued asynchronously; it is unregistered
before it is unmapped. A tenant's descriptor-passed pool is sparse and is not pinned (pinning would fault in
every page of it), as in the daemon.

Primitives:
    SlotMapping.attach: map a daemon's segment as described by its SegmentInfo (by name or by descriptor).
    SlotMapping.use: a context in which ``SlotAccess.view(ref)`` gives a slot's bytes as a tensor, and
        ``SlotAccess.runs(refs)`` a request's slots as strided runs (one view per run of evenly spaced slots).
    SlotMapping.retire / close: unmap when the last user is done (retire) or now (close).
    SlotMapping.prefault: map a named segment's pages into this process ahead of the first copies.
    SegmentMaps: mapping (get), retain (retire the mappings of segments no longer named), close.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from tiercache import fdpass, pinning
from tiercache.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    TierCacheError,
    UnavailableError,
)
from tiercache.shm import SharedSegment
from tiercache.tiers.published import IndexReader, index_bytes

from .results import SegmentInfo, SlotRef

logger = logging.getLogger(__name__)

PREFAULT_MAX_BYTES = 16 << 30
"""The most of a daemon's segment :meth:`SlotMapping.prefault` maps in ahead (page tables cost 1/512 of it)."""
_PREFAULT_STEP = 64 << 20


class SlotAccess:
    """Typed access to the slots of a mapped segment (valid inside ``SlotMapping.use`` only)."""

    def __init__(self, info: SegmentInfo, memory: torch.Tensor) -> None:
        self._info = info
        self._memory = memory

    def view(self, ref: SlotRef) -> torch.Tensor:
        """The bytes of a slot: a 1-D ``uint8`` tensor of ``ref.nbytes`` sharing memory with the segment.

        ``ref.slot`` is the first page of the chunk's run (``info.slot_bytes`` is the page size: the whole
        slot of a daemon without pages); the chunk may span the pages after it, up to
        ``info.max_chunk_bytes`` (0: one slot).

        Raises:
            TierCacheError: the daemon named bytes outside its segment.
        """
        start = self._checked_start(ref)
        return self._memory[start : start + ref.nbytes]

    def runs(self, refs: Sequence[SlotRef]) -> list[tuple[int, torch.Tensor]]:
        """The slots of ``refs`` (in chunk order) grouped into runs: consecutive chunk indices of one size
        whose slots lie at one constant distance, each run one strided ``[n, nbytes]`` view (row ``i`` is
        the slot of chunk ``first + i``, exactly :meth:`view`'s bytes).

        A request's chunks usually sit in consecutive slots (one store's reservation): a 512-chunk request
        is then one view, found from the slot numbers alone, instead of 512 views (and their grouping) at
        a few microseconds each, ~2 ms of a 256 MiB request of 512 KiB chunks.

        Returns:
            ``(first chunk index, [n, nbytes] view)`` per run, in order.

        Raises:
            TierCacheError: the daemon named bytes outside its segment.
        """
        out: list[tuple[int, torch.Tensor]] = []
        page = self._info.slot_bytes
        i = 0
        while i < len(refs):
            first = refs[i]
            start = self._checked_start(first)
            end, step = i + 1, 0
            while end < len(refs):
                ref, prev = refs[end], refs[end - 1]
                gap = ref.slot - prev.slot
                if ref.index != prev.index + 1 or ref.nbytes != first.nbytes or gap <= 0:
                    break
                if step and gap != step:
                    break
                self._checked_start(ref)
                step, end = gap, end + 1
            n = end - i
            view = self._memory[start:].as_strided((n, first.nbytes), ((step * page) or first.nbytes, 1))
            out.append((first.index, view))
            i = end
        return out

    def _checked_start(self, ref: SlotRef) -> int:
        """Where a slot's bytes start in the segment.

        Raises:
            TierCacheError: the daemon named bytes outside its segment.
        """
        info = self._info
        start = ref.slot * info.slot_bytes
        longest = min(info.max_chunk_bytes or info.slot_bytes, info.num_slots * info.slot_bytes - start)
        if not 0 <= ref.slot < info.num_slots or not 0 < ref.nbytes <= longest:
            raise TierCacheError(
                f"data plane: slot {ref.slot} ({ref.nbytes} bytes) outside the segment"
                f" ({info.num_slots} pages of {info.slot_bytes} bytes)"
            )
        return start


class SlotMapping:
    """One mapped daemon segment, shared by every registration that names it. Thread-safe."""

    def __init__(self, segment: SharedSegment, info: SegmentInfo, pin: bool = False) -> None:
        """Wrap a mapped segment; ``pin``: register it as pinned memory when CUDA is present."""
        self.info = info
        self._segment: SharedSegment | None = segment
        self._memory: torch.Tensor | None = torch.frombuffer(segment.buffer, dtype=torch.uint8)
        self.pinned = pin and pinning.pin(self._memory, info.shm_segment)
        self._lock = threading.Lock()
        self._users = 0
        self._retired = False
        pool_bytes = info.num_slots * info.slot_bytes
        self.index = (
            IndexReader(segment.buffer[pool_bytes:], info.index_entries, info.num_slots, info.slot_bytes)
            if info.index_entries
            else None
        )
        """The pool's published index (None: the daemon publishes none). Reading it is safe even after the
        mapping is retired (its view keeps the memory mapped), but only entries found and copied inside
        :meth:`use` count."""

    @classmethod
    def attach(
        cls, info: SegmentInfo, token: str | None = None, timeout_s: float = 10.0, pin: bool = True
    ) -> SlotMapping:
        """Map the segment ``info`` names (by name, or by descriptor from ``info.fd_socket`` with ``token``);
        ``pin``: register a named segment as pinned memory when CUDA is present (never a descriptor's pool).

        Raises:
            NotFoundError: no such segment on this host (the daemon runs elsewhere).
            UnavailableError: the fd socket cannot be reached (the daemon runs elsewhere).
            PermissionDeniedError: the daemon refused the descriptor (token, grant).
            InvalidArgumentError: the segment is smaller than the daemon says, or the description is
                inconsistent.
        """
        needed = index_bytes(info.index_entries) if info.index_entries else 0
        if info.slot_bytes <= 0 or info.num_slots * info.slot_bytes + needed > info.segment_bytes:
            raise InvalidArgumentError(
                "data_plane",
                f"{info.num_slots} slots of {info.slot_bytes} bytes and an index of {needed} bytes do not"
                f" fit {info.segment_bytes} bytes",
            )
        if info.fd_socket:
            name, fd = fdpass.request_segment(info.fd_socket, token, info.fd_grant, timeout_s)
            segment = SharedSegment.from_fd(name, fd)
        else:
            segment = SharedSegment.attach(info.shm_segment)
        if segment.size < info.segment_bytes:
            segment.close()
            raise InvalidArgumentError(
                "data_plane",
                f"segment {info.shm_segment} has {segment.size} bytes, expected {info.segment_bytes}",
            )
        logger.debug("attached shared-memory segment %s (%d bytes)", info.shm_segment, segment.size)
        return cls(segment, info, pin=pin and not info.fd_socket)

    @property
    def name(self) -> str:
        """The segment's name."""
        return self.info.shm_segment

    @contextmanager
    def use(self) -> Iterator[SlotAccess]:
        """Hold the mapping while slot views are in use.

        Raises:
            UnavailableError: the mapping was retired (the daemon moved to another segment).
        """
        with self._lock:
            if self._retired or self._memory is None:
                raise UnavailableError(f"data plane: segment {self.info.shm_segment} was retired")
            self._users += 1
            memory = self._memory
        try:
            yield SlotAccess(self.info, memory)
        finally:
            with self._lock:
                self._users -= 1
                done = self._retired and self._users == 0
            if done:
                self._unmap()

    def retire(self) -> None:
        """Stop handing out views; unmap once the last active ``use`` ends (idempotent)."""
        with self._lock:
            self._retired = True
            done = self._users == 0
        if done:
            self._unmap()

    close = retire

    def prefault(self, max_bytes: int = PREFAULT_MAX_BYTES) -> int:
        """Map the pages of a named segment into this process ahead of its first loads and stores; returns
        the bytes mapped in (0 for a descriptor's pool, or a retired mapping).

        The daemon faults its segment in when it starts, but every process that maps it takes a page fault
        per 4 KiB page on its first access: a fresh engine's first 8 MiB load from L2 took 1.7 ms against
        1.0 ms once mapped in. Run off the request path (the vLLM connector's connect-ahead thread), in steps
        that each hold the mapping (a retire waits for the current step only). A tenant's descriptor-passed
        pool is sparse: mapping it in would allocate every page, so it is left as it is.
        """
        if self.info.fd_socket:
            return 0
        total = min(self.info.segment_bytes, max_bytes)
        done = 0
        while done < total:
            step = min(_PREFAULT_STEP, total - done)
            try:
                with self.use():  # not unmapped meanwhile
                    segment = self._segment
                    if segment is None:
                        break
                    segment.map_in(done, step)
            except UnavailableError:  # retired
                break
            done += step
        return done

    def _unmap(self) -> None:
        with self._lock:
            segment, self._segment = self._segment, None
            memory, self._memory = self._memory, None
            pinned, self.pinned = self.pinned, False
            if self.index is not None:
                self.index.close()
        if pinned and memory is not None:
            pinning.unpin(memory, self.info.shm_segment)  # before the pages under it go
        if segment is not None:
            segment.close()
            logger.debug("unmapped shared-memory segment %s", self.info.shm_segment)


class SegmentMaps:
    """A client's mapped segments by name (a segment that cannot be mapped here is remembered as None).

    Thread-safe. Registrations of several namespaces name the same segment: it is mapped once.
    """

    def __init__(self, token: str | None = None, pin: bool = True) -> None:
        """Args: token: the client's bearer token (presented on the daemon's fd socket); pin: register
        named segments as pinned memory when CUDA is present."""
        self._token = token
        self._pin = pin
        self._lock = threading.Lock()
        self._maps: dict[str, SlotMapping | None] = {}

    def mapping(self, info: SegmentInfo) -> SlotMapping | None:
        """The mapping of the segment ``info`` names, mapping it on first use; None when it cannot be mapped
        in this process (the daemon runs on another host, or the segment is not what it says)."""
        with self._lock:
            if info.shm_segment in self._maps:
                return self._maps[info.shm_segment]
        mapping: SlotMapping | None
        try:
            mapping = SlotMapping.attach(info, self._token, pin=self._pin)
        except (NotFoundError, InvalidArgumentError, UnavailableError, PermissionDeniedError, OSError) as exc:
            logger.info(
                "shared-memory segment %s not usable here (%s); using the byte stream", info.shm_segment, exc
            )
            mapping = None
        with self._lock:
            existing = self._maps.setdefault(info.shm_segment, mapping)
        if existing is not mapping and mapping is not None:
            mapping.retire()
        return existing

    def retain(self, names: frozenset[str]) -> None:
        """Retire the mappings of segments not in ``names`` (the daemon moved on: a restart)."""
        with self._lock:
            retired = [self._maps.pop(n) for n in list(self._maps) if n not in names]
        for mapping in retired:
            if mapping is not None:
                mapping.retire()

    def close(self) -> None:
        """Retire every mapping (each unmaps once its last user is done)."""
        self.retain(frozenset())

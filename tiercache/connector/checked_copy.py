"""Same-host stores that copy the engine's KV into shared-memory slots and checksum it in the same pass.

The daemon keeps an xxh3-64 checksum of every L2 chunk, taken at commit. Hashing a slot at commit reads the
chunk from memory a second time, after the engine's copy wrote it. When the engine's KV is contiguous CPU
memory (:func:`~.kv.chunk_spans`), the engine instead copies each chunk's parts into its slot block by block
and hashes each block while it is still in the CPU's cache (:func:`tiercache.checksum.gather_checksum`), and
sends the checksums with CommitStore: the daemon keeps them and reads nothing again. A wrong checksum (a
buggy engine) only makes that tenant's own chunk a miss when it is copied out, never wrong bytes. Any other
KV (paged, on a GPU) is copied as before and hashed by the daemon.

A large store (at least :data:`~.kv.SPLIT_MIN_BYTES`, two chunks or more) is shared with the caller's helper
thread: the copies (numpy) and the hash (xxhash) release the interpreter lock, and one thread reaches only
part of the machine's copy bandwidth (as for :func:`~.kv.kv_to_run`, which the old path split by layers).
Both threads take the next chunk not yet taken, so a helper that is busy or not scheduled (a loaded host)
leaves its share to the caller instead of holding the store up. A chunk's checksum is one streaming hash,
so a store of one chunk stays on one thread.

Primitives:
    kv_to_slots_checked: copy chunks of a contiguous CPU KV into their slots, hashing as they land.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import torch

from tiercache.checksum import gather_checksum
from tiercache.layout import KVLayout

from .kv import SPLIT_MIN_BYTES, EngineKV, chunk_spans
from .results import SlotRef


def kv_to_slots_checked(
    layout: KVLayout,
    kv: EngineKV,
    refs: Sequence[SlotRef],
    view: Callable[[SlotRef], torch.Tensor],
    helper: Executor | None = None,
    split_min_bytes: int = SPLIT_MIN_BYTES,
) -> dict[int, int] | None:
    """Copy chunk ``ref.index`` of the engine's KV into the slot of each ``ref`` and return each chunk's
    xxh3-64 checksum by ``ref.index``, taken block by block as the bytes landed; None (nothing copied) when
    the KV is not contiguous CPU memory.

    Args:
        layout: the KV layout.
        kv: the engine's KV, checked with :func:`~.kv_check.check_kv` for every chunk named.
        refs: the slots of a store grant (``nbytes`` checked to be ``layout.chunk_bytes``).
        view: a slot's bytes (a 1-D ``uint8`` CPU tensor, e.g. ``SlotAccess.view``).
        helper: one worker thread that shares the chunks of a large store (None: all on this one).
        split_min_bytes: the fewest bytes of a store split with ``helper``.
    """
    spans = chunk_spans(layout, kv)
    if spans is None:
        return None
    part = layout.chunk_bytes // len(spans)
    slots: list[tuple[int, Any]] = [(ref.index, view(ref).numpy()) for ref in refs]
    pending = iter(slots)
    take = threading.Lock()

    def fill() -> dict[int, int]:
        out: dict[int, int] = {}
        while True:
            with take:
                item = next(pending, None)
            if item is None:
                return out
            index, dst = item
            start = index * part
            out[index] = gather_checksum(dst, [span[start : start + part] for span in spans])

    if helper is None or len(slots) < 2 or len(slots) * layout.chunk_bytes < split_min_bytes:
        return fill()
    other = helper.submit(fill)
    try:
        sums = fill()
    finally:
        # Not started yet (its thread busy or not scheduled): this thread took every chunk, it never runs.
        # Started: it is copying its last chunk, and must finish before the slots may be released.
        theirs = {} if other.cancel() else other.result()
    sums.update(theirs)
    return sums

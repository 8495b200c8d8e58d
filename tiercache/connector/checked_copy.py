"""Same-host stores that copy the engine's KV into shared-memory slots and checksum it in the same pass.

The daemon keeps an xxh3-64 checksum of every L2 chunk, taken at commit. Hashing a slot at commit reads the
chunk from memory a second time, after the engine's copy wrote it. When the engine's KV is contiguous CPU
memory (:func:`~.kv.chunk_parts`), the engine instead copies each chunk's parts into its slot block by block
and feeds each block to a streaming hash while it is still in the CPU's cache
(:class:`tiercache.checksum.Hasher`), and sends the checksums with CommitStore: the daemon keeps them and
reads nothing again. A wrong checksum (a buggy engine) only makes that tenant's own chunk a miss when it is
copied out, never wrong bytes. Any other KV (paged, on a GPU) is copied as before and hashed by the daemon.

One thread: the copy of a block holds the interpreter lock, and a second thread taking every other chunk
was measured no faster on a 2-core host (the commit message of this module has the figures).

Primitives:
    kv_to_slots_checked: copy chunks of a contiguous CPU KV into their slots, hashing as they land.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tiercache.checksum import BLOCK_BYTES, Hasher
from tiercache.layout import KVLayout

from .kv import EngineKV, chunk_parts
from .results import SlotRef


def kv_to_slots_checked(
    layout: KVLayout,
    kv: EngineKV,
    refs: Sequence[SlotRef],
    view: Callable[[SlotRef], torch.Tensor],
) -> dict[int, int] | None:
    """Copy chunk ``ref.index`` of the engine's KV into the slot of each ``ref`` and return each chunk's
    xxh3-64 checksum by ``ref.index``, taken block by block as the bytes landed; None (nothing copied) when
    the KV is not contiguous CPU memory.

    Args:
        layout: the KV layout.
        kv: the engine's KV, checked with :func:`~.kv.check_kv` for every chunk named.
        refs: the slots of a store grant (``nbytes`` checked to be ``layout.chunk_bytes``).
        view: a slot's bytes (a 1-D ``uint8`` CPU tensor, e.g. ``SlotAccess.view``).
    """
    parts = chunk_parts(layout, kv)
    if parts is None:
        return None
    get_parts = parts
    slots = [(ref.index, view(ref)) for ref in refs]

    def fill(some: Sequence[tuple[int, torch.Tensor]]) -> dict[int, int]:
        out: dict[int, int] = {}
        for index, slot in some:
            array: Any = slot.numpy()  # ndarray exports the buffer protocol; its stubs do not say so
            dst = memoryview(array)
            hasher = Hasher()
            update = hasher.update
            offset = 0
            for part in get_parts(index):
                end = offset + part.nbytes
                if end - offset <= BLOCK_BYTES:  # one block: no per-block loop (a small layout has many)
                    dst[offset:end] = part
                    update(dst[offset:end])
                else:
                    hasher.copy_in(dst[offset:end], part)
                offset = end
            out[index] = hasher.intdigest()
        return out

    return fill(slots)

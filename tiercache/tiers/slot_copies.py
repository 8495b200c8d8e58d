"""Checked copies into and out of one run of a page pool: the bytes and their checksum in one pass.

A CPU pool's run is copied through numpy views of the pool (:func:`~tiercache.checksum.copy_checksum_array`:
each block hashed while it is in cache, no tensor op per chunk); a strided source or destination goes through
torch (:func:`~tiercache.checksum.copy_checksum_tensor`); a GPU pool copies, then hashes the run in place.
The pool (:mod:`tiercache.tiers.slots`) holds its lock around neither.

Primitives:
    copy_in: copy a source into a run and give the run's checksum.
    copy_out: copy a run to a destination and check it against the commit-time checksum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tiercache.checksum import copy_checksum_array, copy_checksum_tensor
from tiercache.tiers.pages import checksum_of


def copy_in(
    host_row: Callable[[], np.ndarray] | None,
    row: Callable[[], torch.Tensor],
    src: torch.Tensor,
    known: int | None,
) -> int:
    """Copy ``src`` into a run and give its checksum: ``known`` as it is (the source is only copied), else
    hashed as the bytes land.

    Args:
        host_row: the run as a numpy view (None for a GPU pool).
        row: the run as a tensor of the chunk's bytes.
        src: the chunk's bytes.
        known: a checksum the caller already holds.
    """
    if known is None and host_row is not None and src.device.type == "cpu" and src.is_contiguous():
        return copy_checksum_array(host_row(), src.numpy())
    dst = row()
    if known is None and src.device.type == "cpu":
        return copy_checksum_tensor(dst, src)
    dst.copy_(src)
    return known if known is not None else checksum_of(dst)


def copy_out(
    host_row: Callable[[], np.ndarray] | None,
    row: Callable[[], torch.Tensor],
    dst: torch.Tensor,
    nbytes: int,
    checksum: int | None,
) -> bool:
    """Copy a run's ``nbytes`` into ``dst``; False when the bytes that left do not match ``checksum`` (None:
    unchecked, always True).

    Args:
        host_row: the run as a numpy view (None for a GPU pool).
        row: the run as a tensor of the chunk's bytes.
        dst: the destination (at least ``nbytes``).
        nbytes: the chunk's bytes.
        checksum: its commit-time checksum.
    """
    if checksum is not None and host_row is not None and dst.device.type == "cpu" and dst.is_contiguous():
        return copy_checksum_array(dst.numpy(), host_row()) == checksum
    out, src = dst[:nbytes], row()
    if checksum is None:
        out.copy_(src)
        return True
    if out.device.type == "cpu":
        return copy_checksum_tensor(out, src) == checksum
    out.copy_(src)
    return checksum_of(src) == checksum

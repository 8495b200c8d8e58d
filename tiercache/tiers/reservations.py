"""Reservation accounting of a tier that stages stored values: live reservations, their bytes and tokens.

A reservation is a chunk between ``reserve`` and ``commit``/``abort``: it holds a staging buffer (room for
the value header, then the payload the caller writes) and a capacity charge. The table knows which ids are
reserved, how many bytes the live reservations charge, and which are being committed right now (a slot
being committed cannot be committed again or aborted until that commit ends).

The table is not thread-safe on purpose: it is part of its tier's state, and the tier's lock guards every
call together with the rest of that state.

Primitives:
    Reservation: one live reservation (id, payload size, charge, staging buffer).
    ReservationTable: the live reservations of one tier, by slot token.
    fill: copy sources into claimed reservations' buffers, each hashed as it lands (one pass over memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tiercache.checksum import copy_checksum_tensor
from tiercache.errors import ConflictError
from tiercache.tiers.base import WriteSlot
from tiercache.tiers.values import HEADER_BYTES


@dataclass(slots=True)
class Reservation:
    """One live reservation.

    Attributes:
        chunk_id: the chunk it will be committed as.
        nbytes: payload bytes.
        charge: capacity it takes until committed or aborted.
        staging: :data:`~tiercache.tiers.values.HEADER_BYTES` of room for the header, then the payload.
    """

    chunk_id: bytes
    nbytes: int
    charge: int
    staging: torch.Tensor

    @property
    def buffer(self) -> torch.Tensor:
        """The payload part of the staging buffer: what the caller fills."""
        return self.staging[HEADER_BYTES:]


class ReservationTable:
    """The live reservations of one tier, keyed by the token of their :class:`WriteSlot`.

    Not thread-safe: the owning tier calls it with its lock held.
    """

    def __init__(self, label: str) -> None:
        """Args: label: the tier's name in error messages (e.g. ``"L3"``)."""
        self._label = label
        self._tokens = itertools.count(1)
        self._by_token: dict[int, Reservation] = {}
        self._ids: set[bytes] = set()
        self._committing: set[int] = set()
        self._reserved = 0

    @property
    def reserved_bytes(self) -> int:
        """Sum of the charges of the live reservations."""
        return self._reserved

    def is_reserved(self, chunk_id: bytes) -> bool:
        """Whether a live reservation is for ``chunk_id``."""
        return chunk_id in self._ids

    def add(self, res: Reservation) -> WriteSlot:
        """Record a new reservation (its id must not be reserved) and hand out its slot."""
        token = next(self._tokens)
        self._by_token[token] = res
        self._ids.add(res.chunk_id)
        self._reserved += res.charge
        return WriteSlot(chunk_id=res.chunk_id, nbytes=res.nbytes, buffer=res.buffer, token=token)

    def claim(self, slots: Sequence[WriteSlot]) -> tuple[list[int], list[Reservation]]:
        """Mark live reservations as being committed; all or nothing.

        Returns:
            Their tokens and reservations, in slot order.

        Raises:
            ConflictError: a slot is not a live reservation of this table (committed, aborted, being
                committed by another call, or given twice). Nothing is marked.
        """
        tokens: list[int] = []
        for slot in slots:
            res = self._by_token.get(slot.token)
            if (
                res is None
                or res.chunk_id != slot.chunk_id
                or res.nbytes != slot.nbytes
                or slot.token in self._committing
                or slot.token in tokens
            ):
                raise ConflictError(
                    f"slot {slot.token} for chunk {slot.chunk_id.hex()} is not a live "
                    f"{self._label} reservation"
                )
            tokens.append(slot.token)
        self._committing.update(tokens)
        return tokens, [self._by_token[t] for t in tokens]

    def unclaim(self, tokens: Sequence[int]) -> None:
        """End the commit of ``tokens`` (those not finished stay live reservations)."""
        self._committing.difference_update(tokens)

    def finish(self, token: int) -> Reservation:
        """Drop a committed reservation and its charge; returns it (its staging buffer is free now)."""
        res = self._by_token.pop(token)
        self._reserved -= res.charge
        self._ids.discard(res.chunk_id)
        return res

    def abort(self, slots: Sequence[WriteSlot]) -> list[Reservation]:
        """Drop reservations; unknown, finished or in-commit slots are ignored. Returns those dropped."""
        dropped: list[Reservation] = []
        for slot in slots:
            res = self._by_token.get(slot.token)
            if res is None or res.chunk_id != slot.chunk_id or slot.token in self._committing:
                continue
            dropped.append(self.finish(slot.token))
        return dropped

    def clear(self) -> None:
        """Forget every reservation (the tier is closing)."""
        self._by_token.clear()
        self._ids.clear()
        self._reserved = 0


def fill(
    reservations: Sequence[Reservation],
    srcs: Sequence[torch.Tensor] | None,
    checksums: Sequence[int | None] | None,
) -> list[int | None]:
    """Copy each source (checked by the caller: one 1-D ``uint8`` tensor of its reservation's size) into its
    reservation's buffer; returns each one's checksum: the known one (only copied), else taken block by
    block as the bytes land (:func:`~tiercache.checksum.copy_checksum_tensor`; a source off the CPU is
    copied and left to be hashed at encoding, None). Without sources, nothing is copied: all None."""
    if srcs is None:
        return [None] * len(reservations)
    known = checksums if checksums is not None else [None] * len(reservations)
    out: list[int | None] = []
    for res, src, check in zip(reservations, srcs, known, strict=True):
        if check is None and src.device.type == "cpu":
            check = copy_checksum_tensor(res.buffer, src)
        else:
            res.buffer.copy_(src)
        out.append(check)
    return out

"""The reservation table: charges, reserved ids, claims for commit, aborts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tiercache.errors import ConflictError
from tiercache.tiers.reservations import Reservation, ReservationTable
from tiercache.tiers.values import HEADER_BYTES


def reservation(cid: bytes, nbytes: int) -> Reservation:
    return Reservation(
        cid, nbytes, HEADER_BYTES + nbytes, torch.zeros(HEADER_BYTES + nbytes, dtype=torch.uint8)
    )


def test_add_hands_out_the_payload_part_and_counts_the_charge() -> None:
    table = ReservationTable("L3")
    res = reservation(b"a", 10)
    slot = table.add(res)
    assert (slot.chunk_id, slot.nbytes) == (b"a", 10)
    assert slot.buffer.numel() == 10 and slot.buffer.data_ptr() == res.staging.data_ptr() + HEADER_BYTES
    assert table.is_reserved(b"a") and not table.is_reserved(b"b")
    assert table.reserved_bytes == HEADER_BYTES + 10
    other = table.add(reservation(b"b", 5))
    assert other.token != slot.token
    assert table.reserved_bytes == 2 * HEADER_BYTES + 15


def test_claim_is_all_or_nothing_and_blocks_a_second_claim_and_aborts() -> None:
    table = ReservationTable("L3")
    a, b = table.add(reservation(b"a", 10)), table.add(reservation(b"b", 10))
    with pytest.raises(ConflictError, match="not a live L3 reservation"):
        table.claim([a, a])  # given twice
    with pytest.raises(ConflictError):
        table.claim([a, dataclasses.replace(b, nbytes=11)])  # not the slot that was handed out
    tokens, reservations = table.claim([a, b])  # nothing was marked by the failed claims
    assert tokens == [a.token, b.token] and [r.chunk_id for r in reservations] == [b"a", b"b"]
    with pytest.raises(ConflictError):
        table.claim([a])  # being committed
    assert table.abort([a, b]) == []  # in commit: ignored
    table.unclaim(tokens)
    assert [r.chunk_id for r in table.abort([a])] == [b"a"]
    assert not table.is_reserved(b"a") and table.reserved_bytes == HEADER_BYTES + 10
    assert table.abort([a]) == []  # finished: ignored


def test_finish_releases_and_clear_forgets_everything() -> None:
    table = ReservationTable("L3")
    a, b = table.add(reservation(b"a", 10)), table.add(reservation(b"b", 20))
    tokens, _ = table.claim([a])
    assert table.finish(tokens[0]).chunk_id == b"a"
    table.unclaim(tokens)
    assert table.reserved_bytes == HEADER_BYTES + 20 and not table.is_reserved(b"a")
    with pytest.raises(ConflictError):
        table.claim([a])  # committed
    table.clear()
    assert table.reserved_bytes == 0 and not table.is_reserved(b"b")
    with pytest.raises(ConflictError):
        table.claim([b])

"""The L3 access order's bookkeeping: sequence numbers, pending updates, flush cadence."""

from __future__ import annotations

import tiercache.tiers.lmdb_order as order
from tiercache.tiers.lmdb_order import AccessOrder, pack_seq, unpack_seq


def test_sequence_numbers_continue_after_the_stored_ones() -> None:
    log = AccessOrder(last_seq=41)
    assert log.allocate(3) == 42 and log.last_seq == 44
    log.used(b"a")
    assert log.last_seq == 45
    assert log.take() == {b"a": 45}
    assert log.take() == {}


def test_reads_are_pending_until_taken_and_due_after_the_flush_interval() -> None:
    log = AccessOrder()
    for i in range(order.ORDER_FLUSH_READS - 1):
        log.read(bytes([i % 7]))
    assert not log.flush_due
    log.read(b"x")
    assert log.flush_due
    pending = log.take()
    assert not log.flush_due and pending[b"x"] == order.ORDER_FLUSH_READS
    assert len(pending) == 8  # one number per chunk: its latest use


def test_restore_keeps_newer_numbers_and_skips_deleted_chunks() -> None:
    log = AccessOrder()
    log.used(b"a")
    log.used(b"b")
    log.used(b"gone")
    failed = log.take()  # a write that did not land
    log.used(b"a")  # a newer use meanwhile
    log.restore(failed, live={b"a", b"b"})
    assert log.take() == {b"a": 4, b"b": 2}
    log.used(b"c")
    log.forget(b"c")
    assert log.take() == {}


def test_stored_form_is_8_bytes_big_endian() -> None:
    assert pack_seq(258) == b"\x00" * 6 + b"\x01\x02"
    assert unpack_seq(pack_seq(2**63 + 5)) == 2**63 + 5
    assert unpack_seq(b"\x01" * 7) is None and unpack_seq(b"") is None

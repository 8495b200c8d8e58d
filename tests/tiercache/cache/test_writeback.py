"""The write-back worker: a commit's write-downs go as one job, each chunk counted and done in order; deferred
write-downs wait for a spare core, give way to queued ones, and are written down by a flush and (within its
bound) a close."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from tiercache.cache.mover import MoveOutcome
from tiercache.cache.writeback import WRITE_DOWN_NICE, WriteBack


def test_a_batch_is_written_down_in_order_and_one_failure_stops_only_its_chunk() -> None:
    gate = threading.Event()
    done: list[bytes] = []
    steps: dict[bytes, list[MoveOutcome | None]] = {
        b"a": [MoveOutcome.DONE, MoveOutcome.DONE, None],  # two tiers down, then nothing left
        b"b": [MoveOutcome.NO_ROOM],
        b"d": [MoveOutcome.DONE, None],
    }

    def step(cid: bytes) -> MoveOutcome | None:
        assert gate.wait(10)
        if cid == b"c":
            raise OSError("disk gone")
        outcome = steps[cid].pop(0)
        if outcome is None:
            done.append(cid)
        return outcome

    wb = WriteBack(step)
    try:
        wb.schedule_many([b"a", b"b", b"c", b"d"])
        wb.schedule(b"a")  # queued behind the batch: a's copies exist by then (its step says so)
        steps[b"a"].append(None)
        wb.schedule_many([])  # nothing to do: no job
        assert wb.pending == 5  # chunks, not jobs
        gate.set()
        wb.flush(10)
        assert wb.pending == 0
        assert done == [b"a", b"d", b"a"]  # in order; b found no room and c failed, without stopping d
        assert wb.failed == 2
        assert all(not left for left in steps.values())
    finally:
        gate.set()
        wb.close()
    wb.schedule_many([b"x"])  # once closed: ignored
    assert wb.pending == 0


def test_the_write_down_thread_runs_at_a_lower_priority() -> None:
    seen: list[int] = []

    def step(cid: bytes) -> MoveOutcome | None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return None

    wb = WriteBack(step)
    try:
        wb.schedule(b"a")
        wb.flush(10)
    finally:
        wb.close()
    assert seen == [min(19, os.getpriority(os.PRIO_PROCESS, 0) + WRITE_DOWN_NICE)]


def test_deferred_write_downs_wait_for_a_spare_core_then_go_oldest_first() -> None:
    done: list[bytes] = []
    written = threading.Event()
    readings = threading.Semaphore(0)
    spare = [0.0]

    def step(cid: bytes) -> MoveOutcome | None:
        done.append(cid)
        if len(done) == 3:
            written.set()
        return None

    def idle() -> float:
        readings.release()
        return spare[0]

    wb = WriteBack(step, spare_cores=1.0, idle=idle, interval_s=0.01)
    try:
        wb.defer([b"a", b"b"])
        wb.defer([b"c", b"a"])  # a deferred again keeps its place
        for _ in range(8):  # four intervals measured, each one busy
            assert readings.acquire(timeout=10)
        assert done == [] and wb.deferred == 3 and wb.pending == 0
        spare[0] = 1.5
        assert written.wait(10)
        assert done == [b"a", b"b", b"c"]
        assert wb.deferred == 0
    finally:
        wb.close()


def test_a_catch_up_gives_way_to_queued_write_downs() -> None:
    order: list[bytes] = []
    first = threading.Event()
    go_on = threading.Event()

    def step(cid: bytes) -> MoveOutcome | None:
        order.append(cid)
        if cid == b"d0":
            first.set()
            assert go_on.wait(10)
        return None

    wb = WriteBack(step, spare_cores=0.0, idle=lambda: 0.0, interval_s=0.01)
    try:
        wb.defer([b"d0", b"d1", b"d2"])
        assert first.wait(10)  # the catch-up is writing d0
        wb.schedule(b"q")  # a commit's write-down arrives meanwhile
        go_on.set()
        wb.flush(10)
        assert order == [b"d0", b"q", b"d1", b"d2"]  # the queued one went before the rest of the backlog
    finally:
        go_on.set()
        wb.close()


def test_flush_writes_the_backlog_down_even_on_a_busy_host() -> None:
    done: list[bytes] = []
    wb = WriteBack(lambda cid: done.append(cid), spare_cores=float("inf"))  # type: ignore[func-returns-value]
    try:
        wb.defer([b"a", b"b"])
        assert wb.deferred == 2
        wb.flush(10)
        assert done == [b"a", b"b"] and wb.deferred == 0
    finally:
        wb.close()


def test_close_writes_the_backlog_down_for_its_bound_only(caplog: pytest.LogCaptureFixture) -> None:
    done: list[bytes] = []

    def step(cid: bytes) -> MoveOutcome | None:
        done.append(cid)
        return None

    wb = WriteBack(step, spare_cores=float("inf"))
    wb.defer([b"a", b"b"])
    wb.close(catch_up_s=30)
    assert done == [b"a", b"b"]
    wb.defer([b"c"])  # once closed: ignored
    assert wb.deferred == 0

    late = WriteBack(step, spare_cores=float("inf"))
    late.defer([b"x", b"y", b"z"])
    with caplog.at_level(logging.WARNING, logger="tiercache.cache.writeback"):
        late.close(catch_up_s=0)
    assert done == [b"a", b"b"]
    assert "3 chunks stored while their tier was under its watermark were not written down" in caplog.text

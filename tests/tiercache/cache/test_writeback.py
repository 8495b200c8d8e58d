"""The write-back worker: a commit's write-downs go as one job, each chunk counted and done in order."""

from __future__ import annotations

import os
import threading

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

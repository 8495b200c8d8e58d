"""Single flight, and a batch that leads many keys' flights itself (``lead`` / ``land``)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tiercache.singleflight import SingleFlight


def test_a_caller_of_a_led_key_waits_for_the_batch_and_gets_its_result() -> None:
    flights: SingleFlight[str] = SingleFlight()
    assert flights.lead(["a", "b"]) == ["a", "b"]
    ran: list[str] = []
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(flights.run, "a", lambda: ran.append("a") or "own run")
        for _ in range(10_000):  # until it has joined the batch's flight
            if flights.joins:
                break
            threading.Event().wait(0.001)
        assert not waiting.done()  # it waits for the batch, it does not run its own copy
        flights.land("a", "from the batch")
        assert waiting.result(timeout=10) == ("from the batch", True)
    flights.land("b", "b done")
    assert ran == [] and flights.joins == 1
    assert flights.run("a", lambda: "again") == ("again", False)  # nothing is cached after a landing


def test_lead_skips_keys_already_in_flight() -> None:
    flights: SingleFlight[int] = SingleFlight()
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(10)
        return 1

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(flights.run, "a", slow)
        assert started.wait(10)
        assert flights.lead(["a", "b"]) == ["b"]
        release.set()
        assert running.result(timeout=10) == (1, False)
    flights.land("b", 2)


def test_an_exception_landed_is_raised_in_every_waiting_caller() -> None:
    flights: SingleFlight[int] = SingleFlight()
    flights.lead(["k"])
    with ThreadPoolExecutor(2) as pool:
        waiters = [pool.submit(flights.run, "k", lambda: 0) for _ in range(2)]
        flights.land("k", OSError("disk gone"))
        for waiter in waiters:
            with pytest.raises(OSError, match="disk gone"):
                waiter.result(timeout=10)

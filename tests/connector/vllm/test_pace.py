"""How long a busy scheduler step waits for tiercache's answer: a share of the recent steps' length."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tiercache.connector.vllm.asking import ASK_WAIT_MAX_S, ASK_WAIT_S, ASK_WAIT_SHARE, Pace


def test_with_no_step_measured_the_wait_is_the_floor() -> None:
    assert Pace().wait_s() == ASK_WAIT_S


def test_the_wait_is_a_share_of_the_busy_steps_within_floor_and_ceiling() -> None:
    pace = Pace()
    now = 0.0
    for _ in range(30):  # steps of 40 ms
        pace.step(now, busy=True)
        now += 0.040
    assert pace.wait_s() == pytest.approx(ASK_WAIT_SHARE * 0.040)
    for _ in range(30):  # steps of 1 ms: the floor
        pace.step(now, busy=True)
        now += 0.001
    assert pace.wait_s() == ASK_WAIT_S
    for _ in range(30):  # steps of 1 s: the ceiling
        pace.step(now, busy=True)
        now += 1.0
    assert pace.wait_s() == ASK_WAIT_MAX_S


def test_time_after_an_idle_step_is_not_a_step() -> None:
    pace = Pace()
    pace.step(0.0, busy=True)
    pace.step(0.020, busy=True)
    assert pace.step_s == pytest.approx(0.020)
    pace.step(0.040, busy=False)  # nothing ran: vLLM may wait for requests for long
    pace.step(60.0, busy=True)
    assert pace.step_s == pytest.approx(0.020)  # the idle minute was not counted
    pace.step(60.030, busy=True)
    assert 0.020 < pace.step_s < 0.030

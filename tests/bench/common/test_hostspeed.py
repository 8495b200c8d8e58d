"""The host speed probe the benches time next to each measurement."""

from __future__ import annotations

import math

import pytest
import torch

from tiercache.bench.common.hostspeed import probe_host_ms


def test_the_probe_times_its_work_and_leaves_torch_threads_as_they_were() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ms = probe_host_ms(rounds=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert math.isfinite(ms) and ms > 0


def test_a_probe_of_no_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        probe_host_ms(rounds=0)

"""A multi-turn prompt gets every full block of the previous turn back from tiercache in a fresh engine.

Real vLLM engines (CPU, the tiny Llama) with vLLM's usual 128-token blocks and the connector's default chunk
size, on a real daemon. The previous turn's prompt ends mid-way through a
256-token span: chunks larger than a block would leave its last full block out of the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'tiercache[vllm]')")

from tests.connector.vllm.conftest import RunVllm, prompt
from tiercache.testing.plugin import make_daemon

BLOCK = 128
DAEMON_ARGS = (
    "--l2-bytes", "32M", "--slot-bytes", "512K", "--l3-bytes", "64M", "--l1-device", "cpu", "--l1-bytes", "2M",
)  # fmt: skip
"""A 128-token chunk of the tiny model is 256 KiB (2 layers x K/V x 128 tokens x 2 heads x 64 x 4 bytes); the
slots also hold a 256-token chunk."""


def test_a_fresh_engine_gets_every_full_block_of_the_previous_turn(run_vllm: RunVllm, tmp_path: Path) -> None:
    (tmp_path / "daemon").mkdir()
    daemon = make_daemon(tmp_path / "daemon", DAEMON_ARGS)
    try:
        daemon.start()
        extra = {"address": daemon.address}  # the default chunk size
        turn1 = prompt(21, 3 * BLOCK + 40)  # 3 full blocks and a tail: one and a half 256-token spans
        first = run_vllm(extra=extra, block_size=BLOCK, batches=[[{"tokens": turn1}]])
        answer = first["batches"][0][0]["tokens"]
        turn2 = turn1 + answer + prompt(22, 60)
        second = run_vllm(extra=extra, block_size=BLOCK, batches=[[{"tokens": turn2}]])
        assert second["batches"][0][0]["cached"] == 3 * BLOCK  # every full block of turn 1's prompt
    finally:
        daemon.cleanup()

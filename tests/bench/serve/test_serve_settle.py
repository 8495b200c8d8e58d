"""The serve bench reads a cell's tier counters only once the engine's deferred usage reports came in."""

from __future__ import annotations

from pathlib import Path

from tiercache.bench.serve import run as serve_run
from tiercache.connector import TierCacheClient
from tiercache.keys import Namespace
from tiercache.layout import KVDtype, KVLayout
from tiercache.testing.embedded import EmbeddedDaemonConfig, daemon_process
from tiercache.tiers.base import TierLevel

LAYOUT = KVLayout(2, 2, 64, KVDtype.FLOAT32, chunk_tokens=32, page_tokens=32)


def test_a_cell_waits_for_the_reports_the_worker_deferred(tmp_path: Path) -> None:
    daemon = daemon_process(EmbeddedDaemonConfig(slot_bytes=LAYOUT.chunk_bytes, l2_bytes=8 << 20), tmp_path,
                            tmp_path / "l3", tmp_path / "d.sock", "settle")  # fmt: skip
    daemon.start()
    try:
        ns = Namespace(model_id="settle-test", revision="", layout=LAYOUT)
        with TierCacheClient.connect(daemon.address) as client:
            client.report_usage(
                ns, {}, 0, loaded_tokens={TierLevel.L2: 64}, effective_tokens={TierLevel.L2: 64}
            )
            before = serve_run._daemon_tiers(daemon)
            assert before["L2"][0] == 64
            # A cell's last load: the worker defers its report (it goes alone SETTLE_AFTER_S later).
            client.defer_usage(
                ns, {}, 0, loaded_tokens={TierLevel.L2: 96}, effective_tokens={TierLevel.L2: 96}
            )
            tiers = serve_run._settled_tiers(daemon, 96, before)
            assert tiers["L2"] == (96, 96)
            # Nothing more is owed: no wait, the same figures.
            assert serve_run._settled_tiers(daemon, 96, before)["L2"] == (96, 96)
        # Without a daemon (plain vLLM, LMCache) there is nothing to wait for, whatever vLLM counted.
        assert serve_run._settled_tiers(None, 1_000) == {}
    finally:
        daemon.stop()
        daemon.cleanup()

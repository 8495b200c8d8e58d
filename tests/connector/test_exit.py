"""A process that exits while a layer-by-layer load is still copying exits cleanly (a real subprocess).

The load's worker copies with torch. As a daemon thread it was killed inside a torch op when the interpreter
finalized, which aborts the process ("terminate called without an active exception", exit -6) after it had
done its work; now the interpreter waits for it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import contextlib, time
    import torch
    from tiercache.connector.kv import ContiguousKV
    from tiercache.connector.layerwise import LayerwiseLoad
    from tiercache.connector.outcomes import LoadResult
    from tiercache.layout import KVDtype, KVLayout

    layout = KVLayout(2, 2, 8, KVDtype.FLOAT32, 16, 16)
    kv = ContiguousKV([torch.zeros(2, 16, 2, 8) for _ in range(2)])
    work = torch.randn(256, 256)

    @contextlib.contextmanager
    def slow_buffers():
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # a slow copy source: torch work on the load's worker thread
            (work @ work).sum()
        yield [(0, torch.zeros(layout.chunk_bytes, dtype=torch.uint8))]

    LayerwiseLoad.unleased(layout, kv, LoadResult(16, 16, 16), lambda r: None, slow_buffers())
    print("main done", flush=True)
    """
)


def test_exiting_during_a_layerwise_load_waits_for_it() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "main done\n"

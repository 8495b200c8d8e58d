"""A soak: 32 engine processes (the real connector) storing and loading mixed prompts against one daemon.

The work is :func:`tiercache.testing.soak.run_soak` (``tiercache-bench soak``). In CI each engine runs two
phases of 10 s (the issue's 10-minute soak is ``tiercache-bench soak --duration-s 600``): 0 errors, 0 wrong
bytes, and the daemon's footprint flat between the phases, every engine still connected: the same
shared-memory segments, the same open file descriptors, at most a few more threads (pools that grow on
demand) and a bounded RSS growth; once the engines leave, their connections are closed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.testing.soak import RSS_SLACK_BYTES, THREAD_SLACK, SoakConfig, run_soak

ENGINES = 32


@pytest.mark.slow
def test_32_engines_soak_without_errors_and_the_daemon_stays_flat(tmp_path: Path) -> None:
    report = run_soak(SoakConfig(work_dir=tmp_path, engines=ENGINES, duration_s=20.0))
    assert report.engines == ENGINES
    assert report.loads > 0 and report.stores > 0 and report.tokens_loaded > 0
    assert report.errors == 0
    assert report.wrong_loads == 0
    start, end, after = report.start, report.end, report.after
    assert end.segments == start.segments
    assert end.fds == start.fds
    assert end.threads <= start.threads + THREAD_SLACK
    assert end.rss_bytes <= start.rss_bytes + RSS_SLACK_BYTES
    assert after.fds < end.fds  # the engines' connections were closed
    assert after.segments == start.segments

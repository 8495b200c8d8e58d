"""The daemon process of :mod:`tiercache.testing.daemon`: start, kill -9, restart on the same L3, cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiercache.testing.daemon import DaemonStartError
from tiercache.testing.plugin import SMALL_DAEMON_ARGS, DaemonFactory, make_daemon


def test_kill_leaves_the_socket_restart_serves_again_and_cleanup_removes_all(
    daemon_factory: DaemonFactory,
) -> None:
    d = daemon_factory().start()
    assert d.alive() and d.segments() and d.log.exists()
    first_log = d.log
    assert d.kill() == -9
    assert not d.alive() and d.segments() == [] and d.socket.exists()  # what a crash leaves, less the shm
    d.start()  # same socket, prefix and L3
    assert d.starts == 2 and d.log != first_log and "removing stale socket file" in d.stderr()
    assert d.restart().alive()
    d.cleanup()
    assert not d.alive() and d.segments() == [] and not d.socket.exists()


def test_a_daemon_that_cannot_start_says_why(tmp_path: Path) -> None:
    d = make_daemon(tmp_path, [*SMALL_DAEMON_ARGS, "--no-such-flag"])
    with pytest.raises(DaemonStartError, match="exited with 2") as info:
        d.start()
    assert "--no-such-flag" in str(info.value)
    d.cleanup()

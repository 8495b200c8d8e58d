"""Fixtures of the fault tests: the harness plugin's daemons with the options of :mod:`tests.daemon.conftest`."""

from __future__ import annotations

from tests.daemon.conftest import daemon_args, shared_daemon_args

__all__ = ["daemon_args", "shared_daemon_args"]

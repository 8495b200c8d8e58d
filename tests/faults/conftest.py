"""Fixtures of the fault tests: the real daemon processes of :mod:`tests.daemon.conftest`, reused as they are."""

from __future__ import annotations

from tests.daemon.conftest import shared_daemon, start_daemon

__all__ = ["shared_daemon", "start_daemon"]

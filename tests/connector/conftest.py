"""Fixtures of the connector's end-to-end tests: real daemon processes (the harness plugin's fixtures, with
this directory's options) and engine processes (``engine_proc.py``, spoken to with the harness's line
protocol). Every daemon and engine is stopped and cleaned up after.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tiercache.testing.daemon import DaemonProcess, hermetic_env
from tiercache.testing.plugin import SMALL_DAEMON_ARGS, EngineFactory, make_daemon

HERE = Path(__file__).resolve().parent
ENGINE = HERE / "engine_proc.py"
ENGINE_TIMEOUT_S = 120.0
DAEMON_ARGS = (*SMALL_DAEMON_ARGS, "--lease-ttl-s", "2")
"""Options of this directory's daemons: small sizes, leases of 2 s."""


def connector_daemon(root: Path, extra: Sequence[str] = ()) -> DaemonProcess:
    """A (not started) daemon with this directory's options and ``extra`` in ``root``."""
    return make_daemon(root, [*DAEMON_ARGS, *extra])


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    """This directory's daemon options (see :data:`DAEMON_ARGS`)."""
    return DAEMON_ARGS


@pytest.fixture(scope="session")
def engine_mod() -> ModuleType:
    """``engine_proc.py`` imported by path (for its deterministic prompt and KV generators)."""
    spec = importlib.util.spec_from_file_location("tiercache_test_engine_proc", ENGINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run_engine(engine_factory: EngineFactory) -> Callable[..., dict[str, Any]]:
    """Run one engine process (``engine_proc.py`` with keyword params) to completion; returns its result."""

    def run(**params: Any) -> dict[str, Any]:
        engine = engine_factory([sys.executable, str(ENGINE)], params, env=hermetic_env())
        return engine.result(ENGINE_TIMEOUT_S)

    return run


@pytest.fixture
def spawn_engine(engine_factory: EngineFactory) -> Iterator[Callable[..., tuple[Any, dict[str, Any]]]]:
    """Start a long-running engine process and wait (bounded) for its first message; killed after.
    Returns the process (a ``Popen``) and the message."""

    def spawn(**params: Any) -> tuple[Any, dict[str, Any]]:
        engine = engine_factory([sys.executable, str(ENGINE)], params, env=hermetic_env())
        return engine.proc, engine.message(ENGINE_TIMEOUT_S)

    yield spawn

"""The pytest plugin of the process harness: real daemons, Redis deployments and engine processes as
fixtures, each stopped and cleaned up after (segments under ``/dev/shm``, sockets, engine processes).

Registered by the suite's root ``conftest.py`` (``pytest_plugins = ["tiercache.testing.plugin"]``). A
directory's ``conftest.py`` chooses its daemons' options by overriding :func:`daemon_args` (and
:func:`shared_daemon_args` for its module-wide daemon). When a test fails, the tail of the log of every
daemon its fixtures started is added to the report.

Fixtures:
    daemon_args: options of every test daemon (session scope; overridden per directory).
    shared_daemon_args: further options of ``shared_daemon`` (module scope).
    daemon_factory: make (not started) daemons, each in its own directory.
    daemon: one started daemon of :func:`daemon_factory`.
    start_daemon: start daemons on one socket, prefix and L3 (a later one restarts on the first's L3).
    shared_daemon: one started daemon for a whole module.
    redis_cluster / redis_single: a three-master Redis Cluster / one plain server for the session
        (skipped without redis-server).
    engine_factory: start engine processes speaking :mod:`tiercache.testing.engine`'s line protocol.

Helpers:
    SMALL_DAEMON_ARGS: the default :func:`daemon_args`.
    make_daemon: a (not started) test daemon in a directory.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from .daemon import DaemonProcess
from .engine import EngineProcess
from .redis import RedisDeployment, RedisToolsMissing
from .redis import redis_cluster as start_redis_cluster
from .redis import redis_single as start_redis_single

SMALL_DAEMON_ARGS = (
    "--l2-bytes", "16M", "--slot-bytes", "64K", "--l3-bytes", "64M", "--l1-device", "cpu", "--l1-bytes", "1M",
)  # fmt: skip
"""Small sizes: a 16 MiB L2 of 64 KiB slots, a 64 MiB L3, a 1 MiB L1 on the CPU."""

_STARTED = pytest.StashKey[list[DaemonProcess]]()
"""The daemons a test's fixtures made, for its failure report."""


def make_daemon(
    root: Path,
    args: Sequence[str],
    *,
    l3: Path | None = None,
    socket: Path | None = None,
    prefix: str | None = None,
    env: Mapping[str, str] | None = None,
) -> DaemonProcess:
    """A (not started) daemon with ``args``, its L3 in ``l3`` (``root/l3``), its socket ``socket``
    (``root/d.sock``) and a fresh ``tiercache-test-*`` prefix unless given."""
    return DaemonProcess(
        root,
        ["--l3-path", str(l3 if l3 is not None else root / "l3"), *args],
        prefix=prefix or f"tiercache-test-{secrets.token_hex(4)}",
        socket=socket,
        env=env,
    )


def _record(request: pytest.FixtureRequest, daemon: DaemonProcess) -> None:
    node = request.node
    node.stash.setdefault(_STARTED, []).append(daemon)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Add the log tails of the test's daemons to a failed test's report."""
    report = yield
    if report.failed:
        started: list[DaemonProcess] = item.stash.get(_STARTED, [])
        for i, daemon in enumerate(started):
            report.sections.append((f"daemon {i} ({daemon.prefix}) log", daemon.log_tail()))
    return report


@pytest.fixture(scope="session")
def daemon_args() -> tuple[str, ...]:
    """Options of the test daemons (their socket, L2 prefix and L3 path aside); a directory's conftest
    overrides this fixture to choose its own."""
    return SMALL_DAEMON_ARGS


@pytest.fixture(scope="module")
def shared_daemon_args() -> tuple[str, ...]:
    """Further options of :func:`shared_daemon` (none)."""
    return ()


class DaemonFactory(Protocol):
    """``make(*extra_args, name="d", env=None)``: a (not started) daemon in ``tmp_path/name``."""

    def __call__(
        self, *extra: str, name: str = "d", env: Mapping[str, str] | None = None
    ) -> DaemonProcess: ...


@pytest.fixture
def daemon_factory(
    tmp_path: Path, daemon_args: tuple[str, ...], request: pytest.FixtureRequest
) -> Iterator[DaemonFactory]:
    """Make (not started) daemons with extra options, each in its own directory; all cleaned up after."""
    made: list[DaemonProcess] = []

    def make(*extra: str, name: str = "d", env: Mapping[str, str] | None = None) -> DaemonProcess:
        root = tmp_path / name
        root.mkdir()
        d = make_daemon(root, [*daemon_args, *extra], env=env)
        made.append(d)
        _record(request, d)
        return d

    yield make
    for d in made:
        d.cleanup()


@pytest.fixture
def daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    """A started daemon of :func:`daemon_factory`."""
    return daemon_factory().start()


class StartDaemon(Protocol):
    """``start(*extra_args, env=None, l3=None)``: a started daemon on the test's socket and prefix."""

    def __call__(
        self, *extra: str, env: Mapping[str, str] | None = None, l3: Path | None = None
    ) -> DaemonProcess: ...


@pytest.fixture
def start_daemon(
    tmp_path: Path, daemon_args: tuple[str, ...], request: pytest.FixtureRequest
) -> Iterator[StartDaemon]:
    """Start daemons in ``tmp_path`` on one socket, prefix and L3 (``tmp_path/l3`` unless given), so that a
    daemon started after another stopped restarts on what it left; all cleaned up after."""
    started: list[DaemonProcess] = []
    prefix = f"tiercache-test-{secrets.token_hex(4)}"

    def start(*extra: str, env: Mapping[str, str] | None = None, l3: Path | None = None) -> DaemonProcess:
        d = make_daemon(tmp_path, [*daemon_args, *extra], l3=l3, prefix=prefix, env=env)
        started.append(d)
        _record(request, d)
        return d.start()

    yield start
    for d in started:
        d.cleanup()


@pytest.fixture(scope="module")
def shared_daemon(
    tmp_path_factory: pytest.TempPathFactory,
    daemon_args: tuple[str, ...],
    shared_daemon_args: tuple[str, ...],
) -> Iterator[DaemonProcess]:
    """One started daemon for a whole test module (tests that share it use prompts of their own)."""
    d = make_daemon(tmp_path_factory.mktemp("shared-daemon"), [*daemon_args, *shared_daemon_args])
    try:
        yield d.start()
    finally:
        d.cleanup()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisDeployment]:
    """A three-master Redis Cluster (no replicas) on loopback ports, for the session."""
    try:
        with start_redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as deployment:
            yield deployment
    except RedisToolsMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def redis_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisDeployment]:
    """One plain (non-cluster) redis-server on a loopback port, for the session."""
    try:
        with start_redis_single(tmp_path_factory.mktemp("redis-single")) as deployment:
            yield deployment
    except RedisToolsMissing as exc:
        pytest.skip(str(exc))


EngineFactory = Callable[..., EngineProcess]
"""``spawn(argv, params, env=None, cwd=None)``: a started engine process (see :class:`EngineProcess`)."""


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator[EngineFactory]:
    """Start engine processes (their stderr in ``tmp_path``); each is killed and reaped after."""
    engines: list[EngineProcess] = []

    def spawn(argv: Sequence[str], params: Mapping[str, Any], **kwargs: Any) -> EngineProcess:
        stderr_path = tmp_path / f"engine-{len(engines)}.log"
        engine = EngineProcess(argv, params, stderr_path=stderr_path, **kwargs)
        engines.append(engine)
        return engine

    yield spawn
    for engine in engines:
        engine.close()

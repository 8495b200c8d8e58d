"""Private Redis deployments for the shared-tier tests and benches: a Redis Cluster or one plain server on
loopback TCP ports, or one server on a private unix socket (the ``compare`` bench's peer).

Each node is a real ``redis-server`` (no persistence, ``maxmemory-policy allkeys-lru``, as the shared tier
expects of a deployment); a cluster of ``masters`` nodes is created with ``redis-cli --cluster create
--cluster-replicas 0`` and is ready when every node reports ``cluster_state:ok``. A node can be SIGKILLed
and started again on its own port and node config (it rejoins with its slots), so that tests can take a
node away mid-run. Everything is stopped, and the working directory is left to the caller, at exit.

The unix-socket server of :func:`use_redis` listens on no TCP port (``--port 0``), in a private temporary
directory (mode 0700 socket), and keeps nothing on disk either.

Primitives:
    RedisToolsMissing: redis-server / redis-cli are not installed.
    RedisUnavailableError: Redis cannot be used in a run (no binary, no client package, did not start).
    RedisNode: one running node (port, process).
    RedisDeployment: the nodes, the seed ``url``, ``kill(i)``, ``restart(i)``, ``wait_ok()``, ``owner(key)``,
        ``flush()``.
    redis_cluster: context manager yielding a ready cluster.
    redis_single: context manager yielding one plain (non-cluster) server.
    use_redis: context manager yielding a client of a given URL or of a started unix-socket server.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 30.0
_UNIX_START_TIMEOUT_S = 20.0
_POLL_S = 0.05


class RedisToolsMissing(RuntimeError):
    """redis-server or redis-cli is not on PATH."""


class RedisUnavailableError(RuntimeError):
    """Redis cannot be used in this run (the message says why)."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RedisToolsMissing(f"{name} is not installed (Debian: apt-get install redis-server)")
    return path


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports free on loopback whose cluster-bus port (+10000) is free too."""
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20000, 45000)
        if port not in ports and _port_free(port) and _port_free(port + 10000):
            ports.append(port)
    return ports


def _wait(what: str, check: object, deadline_s: float = _START_TIMEOUT_S) -> None:
    """Poll ``check()`` (a callable returning bool) until it is true, or raise after ``deadline_s``."""
    assert callable(check)
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready within {deadline_s:.0f}s")
        time.sleep(_POLL_S)


@dataclass(slots=True)
class RedisNode:
    """One redis-server process."""

    port: int
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process (again) with its own port, directory and node config."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def client(self) -> redis.Redis:
        """A plain client of this node (with the password it was started with, if any)."""
        password = None
        if "--requirepass" in self.argv:
            password = self.argv[self.argv.index("--requirepass") + 1]
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0, password=password)

    def ping(self) -> bool:
        """Whether the node answers."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        c = self.client()
        try:
            return bool(c.ping())
        finally:
            c.close()

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        """Terminate the process (SIGKILL if it does not go within 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass(slots=True)
class RedisDeployment:
    """Running nodes: a cluster (``cluster`` True) or one plain server."""

    nodes: list[RedisNode]
    cluster: bool
    version: str = ""
    password: str = ""

    @property
    def url(self) -> str:
        """The seed URL the shared tier takes: the first node (one seed is enough)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @property
    def urls(self) -> str:
        """Every node, comma-separated (a list of seeds)."""
        return ",".join(f"redis://127.0.0.1:{n.port}" for n in self.nodes)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``."""
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        """Start node ``i`` again (it rejoins the cluster with its slots) and wait until all is ok."""
        self.nodes[i].start()
        _wait(f"redis node {self.nodes[i].port}", self.nodes[i].ping)
        self.wait_ok()

    def wait_ok(self) -> None:
        """Wait until every node answers and, for a cluster, reports ``cluster_state:ok``."""
        for node in self.nodes:
            _wait(f"redis node {node.port}", node.ping)
            if self.cluster:

                def ok(node: RedisNode = node) -> bool:
                    c = node.client()
                    try:
                        info = c.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
                    finally:
                        c.close()
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    return "cluster_state:ok" in text and "cluster_slots_ok:16384" in text

                _wait(f"cluster state at {node.port}", ok)

    def owner(self, key: bytes) -> int:
        """The index of the node serving ``key``'s hash slot (0 for a single server)."""
        if not self.cluster:
            return 0
        c = self.nodes[0].client()
        try:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))  # type: ignore[no-untyped-call]
            ranges = c.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        finally:
            c.close()
        ports = [n.port for n in self.nodes]
        for start, end, master, *_ in ranges:
            if int(start) <= slot <= int(end):
                return ports.index(int(master[1]))
        raise LookupError(f"no node serves slot {slot}")

    def flush(self) -> None:
        """Empty every node (FLUSHALL on each master)."""
        for node in self.nodes:
            c = node.client()
            try:
                c.flushall()
            finally:
                c.close()

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()


def _node(work_dir: Path, port: int, cluster: bool, maxmemory: str, extra: Sequence[str] = ()) -> RedisNode:
    node_dir = work_dir / f"node-{port}"
    node_dir.mkdir(parents=True, exist_ok=True)
    argv = [_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(node_dir), "--daemonize", "no", "--loglevel", "warning",
            "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]  # fmt: skip
    if cluster:
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                 "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"]  # fmt: skip
    return RedisNode(port, [*argv, *extra], node_dir / "redis.log")


@contextlib.contextmanager
def redis_cluster(work_dir: Path, masters: int = 3, maxmemory: str = "256mb") -> Iterator[RedisDeployment]:
    """A ready Redis Cluster of ``masters`` masters (no replicas) on free loopback ports; stopped at exit.

    Raises:
        RedisToolsMissing: redis-server or redis-cli is not installed.
        RuntimeError: the cluster did not come up in time.
    """
    cli = _binary("redis-cli")
    deployment = RedisDeployment([_node(work_dir, p, True, maxmemory) for p in _free_ports(masters)], True)
    try:
        for node in deployment.nodes:
            node.start()
        for node in deployment.nodes:
            _wait(f"redis node {node.port}", node.ping)
        addrs = [f"127.0.0.1:{n.port}" for n in deployment.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=_START_TIMEOUT_S,
        )
        deployment.wait_ok()
        c = deployment.nodes[0].client()
        try:
            deployment.version = str(c.info("server").get("redis_version", "?"))
        finally:
            c.close()
        yield deployment
    finally:
        deployment.stop()


@contextlib.contextmanager
def redis_single(work_dir: Path, maxmemory: str = "256mb", password: str = "") -> Iterator[RedisDeployment]:
    """One ready plain (non-cluster) redis-server on a free loopback port (``--requirepass`` when
    ``password`` is given); stopped at exit."""
    extra = ["--requirepass", password] if password else []
    deployment = RedisDeployment([_node(work_dir, _free_ports(1)[0], False, maxmemory, extra)], False)
    deployment.password = password
    try:
        deployment.nodes[0].start()
        deployment.wait_ok()
        yield deployment
    finally:
        deployment.stop()


@contextlib.contextmanager
def use_redis(url: str | None, work_dir: Path) -> Iterator[tuple[Any, str]]:
    """A Redis client and a description of the server (a started one is stopped at exit).

    Args:
        url: ``redis://host:port`` or ``unix:///path``; None to start a private redis-server.
        work_dir: where a started server's log and working directory go (its socket: a short temp dir).

    Raises:
        RedisUnavailableError: why Redis cannot be used.
    """
    if url is not None:
        client = redis.Redis.from_url(url)
        try:
            client.ping()
        except Exception as exc:
            raise RedisUnavailableError(f"{url}: {exc}") from None
        try:
            yield client, url
        finally:
            client.close()
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailableError("redis-server is not installed (Debian: apt-get install redis-server)")
    sock_dir = Path(tempfile.mkdtemp(prefix="tcbench-redis-"))  # short: a unix socket path has ~107 bytes
    sock = sock_dir / "redis.sock"
    argv = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "",
            "--appendonly", "no", "--dir", str(work_dir), "--daemonize", "no", "--loglevel", "warning"]  # fmt: skip
    node = RedisNode(0, argv, work_dir / "redis.log")
    node.start()
    client = redis.Redis.from_url(f"unix://{sock}")
    try:
        assert node.proc is not None

        def up() -> bool:
            if node.proc is not None and node.proc.poll() is not None:
                raise RedisUnavailableError(f"redis-server exited with {node.proc.returncode}")
            return sock.exists() and bool(client.ping())

        try:
            _wait("redis-server", up, _UNIX_START_TIMEOUT_S)
        except RuntimeError as exc:
            raise RedisUnavailableError(str(exc)) from None
        version = client.info("server").get("redis_version", "?")
        yield client, f"redis-server {version} on {sock} (started by the bench, no persistence)"
    finally:
        client.close()
        node.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)

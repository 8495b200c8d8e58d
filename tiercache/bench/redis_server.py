"""A private ``redis-server`` for the ``compare`` benchmark, or a given one.

The started server listens only on a unix socket in a private temporary directory (``--port 0``), keeps
nothing on disk (no RDB snapshots, no AOF) and is stopped at exit.

Primitives:
    RedisUnavailableError: no redis-server binary, no ``redis`` client package, or it did not start.
    use_redis: context manager yielding a ``redis.Redis`` client (a given URL or a started server).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 20.0


class RedisUnavailableError(RuntimeError):
    """Redis cannot be used in this run (the message says why)."""


def _client(url: str) -> Any:
    try:
        import redis
    except ImportError:
        raise RedisUnavailableError(
            "the redis client package is not installed (pip install 'tiercache[bench]')"
        ) from None
    return redis.Redis.from_url(url)


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
        client = _client(url)
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
    log = (work_dir / "redis.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    client = None
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        client = _client(f"unix://{sock}")
        while True:
            if proc.poll() is not None:
                raise RedisUnavailableError(f"redis-server exited with {proc.returncode}")
            try:
                if sock.exists() and client.ping():
                    break
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RedisUnavailableError(f"redis-server did not answer within {_START_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
        version = client.info("server").get("redis_version", "?")
        yield client, f"redis-server {version} on {sock} (started by the bench, no persistence)"
    finally:
        if client is not None:
            client.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(sock_dir, ignore_errors=True)

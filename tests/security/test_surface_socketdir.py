"""A socket directory another local user prepared is refused: nobody can squat the daemon's sockets.

Today's attack: another uid pre-creates the daemon's socket directory (the default ``/tmp/tiercache-<uid>``
is predictable) with mode 0777, or a symbolic link to a directory of its own; the daemon starts in it and
the attacker swaps ``daemon.sock.fd`` for its own listener, receiving the engines' tokens and grants. The
daemon must refuse such a directory with a message that names it.

The attacker is a real other uid when the tests run as root (``setpriv``, as tests/tenants do); the
default socket path is exercised through ``$XDG_RUNTIME_DIR`` so that the test never touches the host's
real ``/tmp/tiercache-<uid>``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon.conftest import DAEMON_ARGS
from tiercache.testing.daemon import DaemonStartError, hermetic_env
from tiercache.testing.plugin import make_daemon

ATTACKER = 61_003


def _as_attacker(*cmd: str) -> None:
    """Run ``cmd`` as the attacker's uid (root: through setpriv; else skip: no second user to be)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second uid")
    prefix = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups"]
    subprocess.run([*prefix, *cmd], check=True, timeout=30)


@pytest.fixture
def room() -> Iterator[Path]:
    """A directory the attacker may write in, as /tmp is: world-writable and sticky (made in /tmp so that
    the attacker's uid can reach it; pytest's own directories are 0700)."""
    room = Path(tempfile.mkdtemp(prefix="tiercache-squat-"))
    room.chmod(0o1777)
    try:
        yield room
    finally:
        shutil.rmtree(room, ignore_errors=True)


def _refused(tmp_path: Path, socket: Path) -> str:
    """Start a daemon on ``socket``: it must fail to start; its log."""
    d = make_daemon(tmp_path, list(DAEMON_ARGS), socket=socket)
    try:
        with pytest.raises(DaemonStartError):
            d.start()
        return d.stderr()
    finally:
        d.cleanup()


def test_world_writable_socket_directory_of_another_uid_is_refused(tmp_path: Path, room: Path) -> None:
    squat = room / "tiercache-0"
    _as_attacker("mkdir", "-m", "0777", str(squat))
    assert squat.stat().st_uid == ATTACKER and stat.S_IMODE(squat.stat().st_mode) == 0o777
    log = _refused(tmp_path, squat / "daemon.sock")
    assert f"refusing socket directory {squat}: owned by uid {ATTACKER}" in log
    assert not (squat / "daemon.sock").exists() and not (squat / "daemon.sock.fd").exists()


def test_symlinked_socket_directory_is_refused(tmp_path: Path, room: Path) -> None:
    theirs = room / "theirs"
    _as_attacker("mkdir", "-m", "0700", str(theirs))
    link = room / "tiercache-0"
    _as_attacker("ln", "-s", str(theirs), str(link))
    log = _refused(tmp_path, link / "daemon.sock")
    assert f"refusing socket directory {link}: it is a symbolic link" in log


def test_default_socket_directory_squatted_is_refused(tmp_path: Path, room: Path) -> None:
    """No --socket: the default path ($XDG_RUNTIME_DIR/tiercache/daemon.sock here) is checked the same."""
    squat = room / "tiercache"
    _as_attacker("mkdir", "-m", "0777", str(squat))
    prefix = f"tiercache-test-{secrets.token_hex(4)}"
    argv = [
        sys.executable,
        "-m",
        "tiercache.daemon",
        "--l3-path",
        str(tmp_path / "l3"),
        "--l2-prefix",
        prefix,
    ]
    env = {**hermetic_env(), "XDG_RUNTIME_DIR": str(room)}
    try:
        out = subprocess.run([*argv, *DAEMON_ARGS], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon started in {squat}, a directory of uid {ATTACKER} with mode 0777")
    finally:
        for path in Path("/dev/shm").glob(prefix + ".*"):
            path.unlink()
    assert out.returncode != 0
    assert f"refusing socket directory {squat}: owned by uid {ATTACKER}" in out.stderr


def test_group_writable_own_directory_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o770)
    log = _refused(tmp_path, loose / "d.sock")
    assert f"refusing socket directory {loose}: writable by group or others (mode 0770" in log


def test_own_socket_directory_and_socket_modes(tmp_path: Path) -> None:
    """The daemon's own fresh directory is accepted; each socket file gets --socket-mode at bind."""
    sock_dir = tmp_path / "sockets"
    d = make_daemon(tmp_path, [*DAEMON_ARGS, "--socket-mode", "0660"], socket=sock_dir / "d.sock")
    try:
        d.start()
        assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700
        for name in ("d.sock", "d.sock.ctl"):
            assert stat.S_IMODE((sock_dir / name).lstat().st_mode) == 0o660, name
    finally:
        d.cleanup()

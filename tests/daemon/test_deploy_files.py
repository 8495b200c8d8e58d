"""The operator's files in ``daemon/`` against the daemon's real loaders, so that they can never go stale.

* ``tiercache.toml`` is what the loader generates from the options' declarations, loads with the daemon's
  config loader, names every option the loader knows (options whose default is computed on the host as
  commented-out lines), and sets each one to its built-in default.
* ``tokens.example.toml`` parses with the real tokens parser.
* ``tiercache-daemon.service`` only sets ``TIERCACHE_*`` variables the daemon reads.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tiercache.daemon.auth import load_tokens
from tiercache.daemon.config import DaemonConfig
from tiercache.daemon.options import CONFIG_ENV, OPTIONS, example_toml, load_config, resolve_options
from tiercache.options import Values

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DAEMON_DIR = Path(__file__).resolve().parents[2] / "daemon"
EXAMPLE = DAEMON_DIR / "tiercache.toml"
TOKENS = DAEMON_DIR / "tokens.example.toml"
UNIT = DAEMON_DIR / "tiercache-daemon.service"
_COMMENTED = re.compile(r"^#\s*([a-z0-9_]+)\s*=\s*(.+)$")
_BY_NAME = {opt.name: opt for opt in OPTIONS}


@pytest.fixture
def env(tmp_path: Path) -> Mapping[str, str]:
    """An environment without TIERCACHE_* variables, with the XDG directories under ``tmp_path``."""
    return {
        "HOME": str(tmp_path / "home"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }


def active_values() -> dict[str, object]:
    with EXAMPLE.open("rb") as fh:
        return tomllib.load(fh)


def commented_values() -> dict[str, object]:
    """``# name = value`` lines whose name is an option, parsed as TOML."""
    out: dict[str, object] = {}
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = _COMMENTED.match(line)
        if match and match.group(1) in _BY_NAME:
            out.update(tomllib.loads(f"{match.group(1)} = {match.group(2)}"))
    return out


def host_computed(env: Mapping[str, str]) -> set[str]:
    """Options whose default is computed on this host (their ``--help`` text shows the value "here")."""
    defaults = Values(OPTIONS, env)
    return {opt.name for opt in OPTIONS if "here:" in opt.describe_default(defaults)}


def pinned_computed(env: Mapping[str, str]) -> list[str]:
    """Flags pinning the host-computed options to their example values (free disk space moves)."""
    args: list[str] = []
    for name, value in commented_values().items():
        if name in host_computed(env):
            args += [_BY_NAME[name].flag, str(value)]
    return args


def test_the_example_is_what_the_loader_generates() -> None:
    assert EXAMPLE.read_text(encoding="utf-8") == example_toml(), (
        "daemon/tiercache.toml is stale: regenerate it with\n"
        "    python -m tiercache.daemon.options --example-toml > daemon/tiercache.toml"
    )


def test_the_example_names_every_option_once(env: Mapping[str, str]) -> None:
    active, commented = set(active_values()), set(commented_values())
    assert not active & commented, f"both set and commented out: {sorted(active & commented)}"
    missing = set(_BY_NAME) - active - commented
    assert not missing, (
        f"options the daemon knows that daemon/tiercache.toml does not name: {sorted(missing)}"
    )
    assert active <= set(_BY_NAME)  # the loader would refuse an unknown key anyway
    # Only the host-computed defaults may be left commented out, and those must be.
    assert commented == host_computed(env) == {"socket", "l2_bytes", "l3_path", "l3_bytes"}


def test_every_value_is_the_built_in_default(env: Mapping[str, str]) -> None:
    values, defaults = active_values(), Values(OPTIONS, env)
    for opt in OPTIONS:
        if opt.name in values:
            assert opt.parse(values[opt.name]) == defaults[opt.name], f"{opt.name} = {values[opt.name]!r}"
    for name, value in commented_values().items():
        _BY_NAME[name].parse(value)  # an uncommented line would load


def test_the_example_loads_with_the_daemon_loader_and_changes_nothing(env: Mapping[str, str]) -> None:
    pins = pinned_computed(env)
    from_file = resolve_options(["--config", str(EXAMPLE), *pins], env)
    assert from_file == resolve_options(pins, env)
    assert from_file == resolve_options(pins, {**env, CONFIG_ENV: str(EXAMPLE)})
    config = load_config(["--config", str(EXAMPLE)], env)
    assert isinstance(config, DaemonConfig)
    assert config.listen.socket == str(Path(env["XDG_RUNTIME_DIR"]) / "tiercache" / "daemon.sock")
    assert config.tiers.l3 is not None and config.tiers.l3.path == str(
        Path(env["XDG_CACHE_HOME"]) / "tiercache" / "l3"
    )


def test_the_tokens_example_parses_with_the_real_parser() -> None:
    tokens = load_tokens(str(TOKENS))
    assert sorted(tokens.values()) == ["team-a", "team-b"]


def test_the_unit_sets_only_variables_the_daemon_reads() -> None:
    text = UNIT.read_text(encoding="utf-8")
    names = re.findall(r"^Environment=(TIERCACHE_[A-Z0-9_]+)=", text, flags=re.MULTILINE)
    known = {opt.env for opt in OPTIONS} | {CONFIG_ENV}
    assert names and set(names) <= known, sorted(set(names) - known)
    assert re.search(r"^ExecStart=\S+/tiercache-daemon\b", text, flags=re.MULTILINE)
    assert re.search(r"^RuntimeDirectory=tiercache$", text, flags=re.MULTILINE)

"""Configuration: precedence (defaults < TOML < environment < flags), defaults, bad values -> exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiercache.codec import Codec
from tiercache.daemon.cli import main
from tiercache.daemon.config import ConfigError
from tiercache.daemon.options import CONFIG_ENV, OPTIONS, load_config, resolve_options
from tiercache.options import Option
from tiercache.parsers import format_size, parse_size
from tiercache.policies import EvictionPolicyKind, WritePolicyKind
from tiercache.tiers.host import default_l2_bytes


def test_precedence_defaults_toml_env_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(
        'slot_bytes = "1M"\nl2_bytes = "8M"\nlease_ttl_s = 5\neviction_policy = "lfu"\n'
        "l3_durable = true\nsocket_mode = 0o640\n"
    )
    env = {"TIERCACHE_L2_BYTES": "16M", "TIERCACHE_LEASE_TTL_S": "7", "HOME": str(tmp_path)}
    opts = resolve_options(["--config", str(cfg), "--lease-ttl-s", "9"], env)
    assert opts["slot_bytes"] == 1 << 20  # TOML over the default
    assert opts["l2_bytes"] == 16 << 20  # environment over TOML
    assert opts["lease_ttl_s"] == 9.0  # flag over environment
    assert opts["eviction_policy"] is EvictionPolicyKind.LFU  # TOML
    assert opts["l3_durable"] is True and opts["socket_mode"] == 0o640  # TOML natives
    assert opts["write_policy"] is WritePolicyKind.WATERMARK  # default
    assert opts["l3_codec"] is Codec.RAW and opts["stream_chunk_bytes"] == 4 << 20  # defaults
    # The config file can also come from the environment; a --no- flag beats it.
    opts = resolve_options(["--no-l3-durable"], {"TIERCACHE_CONFIG": str(cfg), "HOME": str(tmp_path)})
    assert opts["slot_bytes"] == 1 << 20 and opts["l3_durable"] is False


def test_computed_defaults(tmp_path: Path) -> None:
    opts = resolve_options([], {"XDG_RUNTIME_DIR": "/run/user/7", "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert opts["socket"] == "/run/user/7/tiercache/daemon.sock"
    assert opts["l3_path"] == str(tmp_path / "c" / "tiercache" / "l3")
    assert 0 < opts["l3_bytes"] <= 16 << 30
    assert opts["l2_bytes"] % opts["slot_bytes"] == 0 and opts["l2_bytes"] >= opts["slot_bytes"]
    assert opts["l1_device"] == "auto" and opts["l1_bytes"] == 2 << 30
    opts = resolve_options([], {"HOME": str(tmp_path)})
    assert opts["socket"] == f"/tmp/tiercache-{os.getuid()}/daemon.sock"
    assert opts["l3_path"] == str(tmp_path / ".cache" / "tiercache" / "l3")
    assert default_l2_bytes(1 << 50) == 1 << 50  # at least one slot


def test_sizes() -> None:
    assert parse_size("64K") == 65536
    assert parse_size("32m") == 32 << 20
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("1T") == 1 << 40
    assert parse_size("4096") == 4096
    assert parse_size(123) == 123
    assert parse_size("1.5K") == 1536 and parse_size("0.5GiB") == 1 << 29  # fractions of whole bytes
    for bad in ("12Q", "-1", "1.5", "0.3K", "", True, -3):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(32 << 20) == "32M" and format_size(1000) == "1000"


def test_l1_device_none_and_cpu(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert (
        load_config(["--l1-device", "none", "--l2-bytes", "1M", "--slot-bytes", "64K"], env).tiers.l1 is None
    )
    cfg = load_config(
        ["--l1-device", "cpu", "--l1-bytes", "1M", "--l2-bytes", "1M", "--slot-bytes", "64K"], env
    )
    assert cfg.tiers.l1 is not None and cfg.tiers.l1.device == "cpu"
    assert load_config(["--l3-path", "", "--l2-bytes", "1M", "--slot-bytes", "64K"], env).tiers.l3 is None


@pytest.mark.parametrize(
    ("argv", "env", "toml", "expected"),
    [
        (["--slot-bytes", "12Q"], {}, None, "--slot-bytes: expected a size"),
        (["--write-policy", "fifo"], {}, None, "--write-policy: unknown value 'fifo'; valid: write_through"),
        (
            [],
            {"TIERCACHE_EVICTION_POLICY": "mru"},
            None,
            "--eviction-policy (from TIERCACHE_EVICTION_POLICY)",
        ),
        ([], {}, 'slot_size = "1M"\n', "unknown option 'slot_size'"),
        ([], {}, 'l3_zstd_level = "x"\n', "--l3-zstd-level (from config file"),
        ([], {}, "this is not toml", "is not valid TOML"),
        (["--l3-zstd-level", "99"], {}, None, "--l3-zstd-level: must be an integer in"),
        (["--l2-bytes", "1K"], {}, None, "--l2-bytes: 1024 bytes is smaller than one slot"),
        (["--tcp", "nope"], {}, None, "--tcp: expected HOST:PORT"),
        (["--socket-mode", "999"], {}, None, "--socket-mode: expected an octal file mode"),
        (["--lease-ttl-s", "0"], {}, None, "--lease-ttl-s: must be > 0"),
        (["--lease-ttl-s", "nan"], {}, None, "--lease-ttl-s: expected a finite number"),
        (["--stream-chunk-bytes", "8M"], {}, None, "--stream-chunk-bytes: must be in"),
        (["--socket", "", "--tcp", ""], {}, None, "--socket: both --socket and --tcp are empty"),
        (["--l1-device", "tpu"], {}, None, "--l1-device: expected auto, none, cpu, cuda or cuda:N"),
        (["--l1-device", "cuda:7"], {}, None, "--l1-device: 'cuda:7'"),
        (["--log-level", "LOUD"], {}, None, "--log-level: unknown level"),
        (["--l3-codec", "lz4"], {}, None, "--l3-codec: unknown value 'lz4'; valid: raw, zstd"),
        (["--selective-min-hits", "0"], {}, None, "--selective-min-hits: must be a positive integer"),
        (["--l2-prefix", "a/b"], {}, None, "--l2-prefix:"),
        (["--metrics-port", "70000"], {}, None, "--metrics-port:"),
        (["--torch-threads", "0"], {}, None, "--torch-threads: must be a positive integer"),
        (["--l3-fault-read-delay-s", "-1"], {}, None, "--l3-fault-read-delay-s: must be >= 0"),
        ([], {"TIERCACHE_L3_FAULT_READ_BYTES_PER_S": "fast"}, None, "--l3-fault-read-bytes-per-s (from"),
        (["--max-ttl-s", "0"], {}, None, "--max-ttl-s: must be a finite number of seconds >= lease_ttl_s"),
        (["--max-ttl-s", "inf"], {}, None, "--max-ttl-s: expected a finite number"),
        (["--lease-ttl-s", "60", "--max-ttl-s", "59"], {}, None, "--max-ttl-s: must be a finite number"),
        ([], {"TIERCACHE_MAX_TTL_S": "long"}, None, "--max-ttl-s (from TIERCACHE_MAX_TTL_S)"),
        (
            [],
            {},
            "lease_ttl_s = 400\n",
            "--max-ttl-s: must be a finite number of seconds >= lease_ttl_s (400.0)",
        ),
    ],
)
def test_bad_values_exit_2_naming_the_option(
    argv: list[str],
    env: dict[str, str],
    toml: str | None,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in [k for k in os.environ if k.startswith("TIERCACHE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if toml is not None:
        (tmp_path / "c.toml").write_text(toml)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err


def test_bad_value_in_a_real_process_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    tokens = tmp_path / "missing-tokens.toml"
    for argv, expected in (
        (
            ["--tokens-file", str(tokens), "--l2-bytes", "1M", "--slot-bytes", "64K"],
            "--tokens-file: cannot read",
        ),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", "tiercache.daemon", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 2, out.stderr
        assert expected in out.stderr


def test_bad_tokens_file_exits_2(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    tokens = tmp_path / "tokens.toml"
    for text, expected in (
        ('[tokens]\n"t" = 3\n', "tenant of a token must be a non-empty string"),
        ("[tokens]\n", "needs a non-empty [tokens] table"),
    ):
        tokens.write_text(text)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tiercache.daemon",
                "--tokens-file",
                str(tokens),
                "--l2-bytes",
                "1M",
                "--slot-bytes",
                "64K",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 2 and "--tokens-file" in out.stderr and expected in out.stderr, out.stderr


def test_help_lists_every_option_with_its_default() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tiercache.daemon", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--config PATH" in text
    for opt in OPTIONS:
        assert opt.flag in text, opt.flag
        assert f"env {opt.env})" in text, opt.env
    assert text.count("(default:") == len(OPTIONS) + 1
    assert "--l3-fault-read-delay-s FLOAT fault injection, off by default" in text
    assert "--l3-fault-read-bytes-per-s SIZE fault injection, off by default" in text
    for fragment in ("(default: 32M;", "(default: 0600;", "(default: watermark;", "(default: adaptive;", "(default: 8M;",
                     "(default: 4M;", "(default: tiercache-l2;", "(default: 127.0.0.1;", "(default: INFO;",
                     "10% of physical RAM", "min(8G, 10% of the free space"):  # fmt: skip
        assert fragment in text, fragment


def test_max_ttl_s_defaults_to_300_and_is_resolved_like_every_option(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    argv = ["--l2-bytes", "1M", "--slot-bytes", "64K", "--l3-path", ""]
    assert load_config(argv, env).cache.max_ttl_s == 300.0
    cfg = tmp_path / "daemon.toml"
    cfg.write_text("max_ttl_s = 40\n")
    assert load_config([*argv, "--config", str(cfg)], env).cache.max_ttl_s == 40.0  # TOML
    env = {**env, "TIERCACHE_CONFIG": str(cfg), "TIERCACHE_MAX_TTL_S": "50"}
    assert load_config(argv, env).cache.max_ttl_s == 50.0  # environment over TOML
    assert load_config([*argv, "--max-ttl-s", "60.5"], env).cache.max_ttl_s == 60.5  # flag over environment


def test_l3_fault_injection_is_off_by_default_and_resolved_like_every_option(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    l3 = load_config(["--l2-bytes", "1M", "--slot-bytes", "64K"], env).tiers.l3
    assert l3 is not None and (l3.fault_read_delay_s, l3.fault_read_bytes_per_s) == (0.0, 0)
    cfg = tmp_path / "daemon.toml"
    cfg.write_text('l3_fault_read_delay_s = 0.5\nl3_fault_read_bytes_per_s = "1M"\n')
    env = {**env, "TIERCACHE_CONFIG": str(cfg), "TIERCACHE_L3_FAULT_READ_DELAY_S": "1.5"}
    l3 = load_config(
        ["--l2-bytes", "1M", "--slot-bytes", "64K", "--l3-fault-read-bytes-per-s", "2M"], env
    ).tiers.l3
    assert l3 is not None
    assert l3.fault_read_delay_s == 1.5  # environment over TOML
    assert l3.fault_read_bytes_per_s == 2 << 20  # flag over TOML


_CANDIDATES = {  # three valid spellings per option whose parser takes no plain number (bools and enums repeat)
    "socket_mode": ("0640", "0641", "0642"),
    "tcp": ("127.0.0.1:1", "127.0.0.1:2", "[::1]:3"),
    "l1_device": ("cpu", "none", "cuda:1"),
    "log_level": ("DEBUG", "WARNING", "ERROR"),
}


def _spellings(opt: Option) -> tuple[str, str, str]:
    """Three strings ``opt`` accepts, of (where the type has them) three different values."""
    if opt.name in _CANDIDATES:
        a, b, c = _CANDIDATES[opt.name]
        return a, b, c
    for spellings in (("1M", "2M", "3M"), ("1", "2", "3"), ("1.5", "2.5", "3.5"), ("true", "false", "true")):
        try:
            [opt.parse(s) for s in spellings]
        except ValueError:
            continue
        return spellings
    members: list[str] = []
    for text in ("raw", "zstd", "lru", "lfu", "write_through", "on_evict", "selective"):
        try:
            opt.parse(text)
        except ValueError:
            continue
        members.append(text)
    if len(members) >= 2:
        return members[0], members[1], members[2 % len(members)]
    raise AssertionError(f"no test values for {opt.name}: add them to _CANDIDATES")


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda opt: opt.name)
def test_each_option_resolves_toml_then_environment_then_flag(opt: Option, tmp_path: Path) -> None:
    in_file, in_env, in_flag = _spellings(opt)
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(f"{opt.name} = {opt.toml(opt.parse(in_file))}\n")
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    flag = (
        ([opt.flag] if opt.parse(in_flag) else [f"--no-{opt.flag[2:]}"])
        if opt.boolean
        else [opt.flag, in_flag]
    )
    assert resolve_options(["--config", str(cfg)], env)[opt.name] == opt.parse(in_file)
    env[opt.env] = in_env
    assert resolve_options(["--config", str(cfg)], env)[opt.name] == opt.parse(in_env)
    assert resolve_options(["--config", str(cfg), *flag], env)[opt.name] == opt.parse(in_flag)
    # and the same through the config file named by the environment
    env[CONFIG_ENV] = str(cfg)
    del env[opt.env]
    assert resolve_options([], env)[opt.name] == opt.parse(in_file)


@pytest.mark.parametrize("text", ['slot_byte = "1M"\n', '[l3]\npath = "/x"\n'])
def test_an_unknown_toml_key_fails_naming_it(text: str, tmp_path: Path) -> None:
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(text)
    key = text.split()[0].strip("[]")
    with pytest.raises(ConfigError, match=rf"unknown option '{key}'; valid: .*slot_bytes"):
        resolve_options(["--config", str(cfg)], {"HOME": str(tmp_path)})

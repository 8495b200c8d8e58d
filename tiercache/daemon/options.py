"""The options of ``tiercache-daemon`` and where their values come from.

Precedence, lowest first: built-in defaults < the TOML config file (``--config PATH`` or
``TIERCACHE_CONFIG``; a flat table whose keys are the option names with underscores) < ``TIERCACHE_<NAME>``
environment variables < command-line flags. Some defaults are computed on this host (socket and L3 paths from
the XDG directories, L2 from physical RAM, L3 from free disk space); ``--help`` shows the rule and the value.

Primitives:
    Option: one row of the table (name, parser, default, help).
    OPTIONS: the table, in dependency order (a computed default sees the options above it).
    build_parser: the argparse parser; ``--help`` lists every option with its default.
    resolve_options: the typed :class:`~tiercache.daemon.config.Options` of argv + environment + file.
    load_config: the validated :class:`~tiercache.daemon.config.DaemonConfig`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tiercache.codec import Codec
from tiercache.policies import EvictionPolicyKind, WritePolicyKind

from .config import ConfigError, DaemonConfig, Options
from .parsers import (
    L1Device,
    format_size,
    parse_bool,
    parse_choice,
    parse_device,
    parse_float,
    parse_int,
    parse_log_level,
    parse_octal,
    parse_size,
    parse_str,
    parse_tcp,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "TIERCACHE_"
"""Environment variables ``TIERCACHE_<OPTION_UPPER_SNAKE>`` override the config file."""
CONFIG_ENV = ENV_PREFIX + "CONFIG"
"""Environment variable naming the config file when ``--config`` is not given."""
L3_DEFAULT_CAP_BYTES = 8 << 30
"""The computed L3 default never exceeds this."""

Environ = Mapping[str, str]
Resolved = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Option:
    """One option.

    Attributes:
        name: underscore name: the TOML key; the flag is ``--name-with-dashes``, the variable
            ``TIERCACHE_NAME``.
        parse: turns a string or TOML scalar into the typed value (raises ValueError).
        default: the built-in default, given the environment and the options resolved before this one.
        doc: how ``--help`` describes the default, given the same.
        help: what the option does.
        metavar: placeholder in ``--help``.
        boolean: a ``--flag/--no-flag`` switch.
    """

    name: str
    parse: Callable[[object], object]
    default: Callable[[Environ, Resolved], object]
    doc: Callable[[Environ, Resolved], str]
    help: str
    metavar: str = ""
    boolean: bool = False

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable."""
        return ENV_PREFIX + self.name.upper()


def _fixed(
    value: object, text: str | None = None
) -> tuple[Callable[[Environ, Resolved], object], Callable[[Environ, Resolved], str]]:
    shown = text if text is not None else str(value)
    return (lambda env, r: value), (lambda env, r: shown)


def default_socket(env: Environ) -> str:
    """``$XDG_RUNTIME_DIR/tiercache/daemon.sock``, else ``/tmp/tiercache-<uid>/daemon.sock``."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "tiercache" / "daemon.sock")
    return f"/tmp/tiercache-{os.getuid()}/daemon.sock"


def default_l3_path(env: Environ) -> str:
    """``$XDG_CACHE_HOME/tiercache/l3``, else ``~/.cache/tiercache/l3``."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return str(Path(base) / "tiercache" / "l3")


def physical_ram_bytes() -> int:
    """Bytes of physical memory of this host."""
    return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))


def default_l2_bytes(slot_bytes: int) -> int:
    """10% of physical RAM rounded down to whole slots, at least one slot."""
    if slot_bytes <= 0:
        return 0
    return max(slot_bytes, physical_ram_bytes() // 10 // slot_bytes * slot_bytes)


def free_bytes_at(path: str) -> int:
    """Bytes available to this user on the filesystem that holds (or will hold) ``path``."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return int(st.f_bavail) * int(st.f_frsize)


def default_l3_bytes(path: str) -> int:
    """``min(8G, 10% of the free space on the filesystem of path)``; 0 when L3 is off."""
    if not path:
        return 0
    return min(L3_DEFAULT_CAP_BYTES, free_bytes_at(path) // 10)


def _l2_default(env: Environ, r: Resolved) -> object:
    return default_l2_bytes(cast(int, r["slot_bytes"]))


DEFAULT_PAGE_BYTES = 64 << 10
"""The L1/L2 page size unless set, when it divides --slot-bytes (else one page per slot): with pages of
64 KiB any mix of chunk sizes from 256 KiB up fills >= 94 % of the tiers (issue 13's measurement), where one
page per slot filled 2-38 % with chunks well under the slot size. A slot that is not a whole number of such
pages (a daemon sized to one exact chunk) keeps one page per slot, so that as many chunks fit as before."""


def _page_default(env: Environ, r: Resolved) -> object:
    slot = cast(int, r["slot_bytes"])
    return DEFAULT_PAGE_BYTES if slot > 0 and slot % DEFAULT_PAGE_BYTES == 0 else slot


def _l3_bytes_default(env: Environ, r: Resolved) -> object:
    return default_l3_bytes(cast(str, r["l3_path"]))


OPTIONS: tuple[Option, ...] = (
    Option(
        "socket",
        parse_str,
        lambda env, r: default_socket(env),
        lambda env, r: (
            f"$XDG_RUNTIME_DIR/tiercache/daemon.sock, else /tmp/tiercache-<uid>/daemon.sock; here: {default_socket(env)}"
        ),
        'unix socket to listen on ("" disables); its directory is created with mode 0700',
        "PATH",
    ),
    Option("socket_mode", parse_octal, *_fixed(0o600, "0600"), "permission bits of the socket file", "OCTAL"),
    Option(
        "control_socket",
        parse_bool,
        *_fixed(True, "true"),
        "also serve the unary calls on <socket>.ctl, a plain unix socket that same-host engines use instead "
        "of gRPC (a call ~0.4-0.8 ms instead of ~1.5-2 ms after idle)",
        boolean=True,
    ),
    Option("tcp", parse_tcp, *_fixed("", '"" (off)'), "TCP address to listen on as HOST:PORT", "HOST:PORT"),
    Option(
        "tokens_file",
        parse_str,
        *_fixed("", '"" (no authentication: one default tenant)'),
        'TOML file with a [tokens] table of "token" = "tenant"; every call then needs '
        '"authorization: Bearer <token>"',
        "PATH",
    ),
    Option(
        "tls_cert",
        parse_str,
        *_fixed("", '"" (off)'),
        "PEM certificate chain of the TCP listener: with --tls-key, TCP speaks TLS",
        "PATH",
    ),
    Option("tls_key", parse_str, *_fixed("", '"" (off)'), "PEM private key of --tls-cert", "PATH"),
    Option(
        "tls_client_ca",
        parse_str,
        *_fixed("", '"" (off)'),
        "PEM CA certificates of the clients: set, TCP clients must present a certificate it signed "
        "(mutual TLS)",
        "PATH",
    ),
    Option(
        "allow_plaintext_tcp",
        parse_bool,
        *_fixed(False, "false"),
        "start a plaintext TCP listener although a tokens file is set (the tokens then cross the network "
        "in clear text)",
        boolean=True,
    ),
    Option(
        "slot_bytes",
        parse_size,
        *_fixed(32 << 20, "32M"),
        "L1/L2 slot size: the largest chunk the daemon accepts",
        "SIZE",
    ),
    Option(
        "page_bytes",
        parse_size,
        _page_default,
        lambda env, r: "64K when it divides --slot-bytes, else --slot-bytes",
        "L1/L2 page size, at most --slot-bytes (0: --slot-bytes, one page per chunk): a chunk takes as many "
        "whole pages as it needs, so pages well under the chunk size fill L1/L2 with any mix of chunk "
        "sizes; engines that predate pages refuse chunks longer than a page",
        "SIZE",
    ),
    Option(
        "l1_device",
        parse_device,
        *_fixed("auto", "auto (cuda when CUDA is available, else none)"),
        "device of the L1 tier: auto, cpu, cuda, cuda:N or none",
        "DEVICE",
    ),
    Option("l1_bytes", parse_size, *_fixed(2 << 30, "2G"), "L1 capacity", "SIZE"),
    Option(
        "l2_bytes",
        parse_size,
        _l2_default,
        lambda env, r: (
            f"10% of physical RAM in whole slots, at least one; here: {format_size(cast(int, _l2_default(env, r)))}"
        ),
        "L2 (shared-memory) capacity",
        "SIZE",
    ),
    Option(
        "l2_prefix", parse_str, *_fixed("tiercache-l2"), "name prefix of the L2 shared-memory segment", "NAME"
    ),
    Option(
        "l2_verify_loads",
        parse_bool,
        *_fixed(False, "false"),
        "check each L2 chunk's checksum before leasing it to an engine (off: it costs more than a tenth of a load here)",
        boolean=True,
    ),
    Option(
        "l3_path",
        parse_str,
        lambda env, r: default_l3_path(env),
        lambda env, r: f"$XDG_CACHE_HOME/tiercache/l3 (~/.cache/tiercache/l3); here: {default_l3_path(env)}",
        'directory of the L3 LMDB environment ("" disables L3)',
        "PATH",
    ),
    Option(
        "l3_bytes",
        parse_size,
        _l3_bytes_default,
        lambda env, r: (
            "min(8G, 10% of the free space on the --l3-path filesystem at start); "
            f"here: {format_size(cast(int, _l3_bytes_default(env, r)))}"
        ),
        "L3 capacity",
        "SIZE",
    ),
    Option(
        "l3_codec", parse_choice(Codec), *_fixed(Codec.RAW, "raw"), "L3 payload codec: raw or zstd", "CODEC"
    ),
    Option("l3_zstd_level", parse_int, *_fixed(3), "zstd level of L3 payloads", "INT"),
    Option(
        "l3_durable",
        parse_bool,
        *_fixed(False, "false"),
        "fsync every L3 commit (otherwise an OS crash may lose the last commits)",
        boolean=True,
    ),
    Option(
        "l3_fault_read_delay_s",
        parse_float,
        *_fixed(0.0, "0 (off)"),
        "fault injection, off by default: seconds added to every L3 read (for deadline tests)",
        "FLOAT",
    ),
    Option(
        "l3_fault_read_bytes_per_s",
        parse_size,
        *_fixed(0, "0 (off)"),
        "fault injection, off by default: throttle L3 reads to this many bytes per second",
        "SIZE",
    ),
    Option(
        "write_policy",
        parse_choice(WritePolicyKind),
        *_fixed(WritePolicyKind.WRITE_THROUGH, "write_through"),
        "when chunks are written down: write_through, on_evict or selective",
        "POLICY",
    ),
    Option(
        "eviction_policy",
        parse_choice(EvictionPolicyKind),
        *_fixed(EvictionPolicyKind.ADAPTIVE, "adaptive"),
        "which chunk is evicted first: adaptive (recency or scan resistant, learnt per tier), lru, lfu or "
        "segmented (scan resistant)",
        "POLICY",
    ),
    Option(
        "selective_min_hits",
        parse_int,
        *_fixed(2),
        "reads after which the selective policy writes a chunk down when it is evicted",
        "INT",
    ),
    Option(
        "lease_ttl_s",
        parse_float,
        *_fixed(30.0, "30"),
        "default lifetime of load leases and store tickets, seconds",
        "FLOAT",
    ),
    Option(
        "max_ttl_s",
        parse_float,
        *_fixed(300.0, "300"),
        "longest lifetime an engine may ask for a load lease, store ticket or prefill claim, seconds "
        "(a longer one is refused with INVALID_ARGUMENT); at least --lease-ttl-s",
        "FLOAT",
    ),
    Option(
        "min_residency_s",
        parse_float,
        *_fixed(0.0, "0"),
        "a newly stored chunk is not evicted from a tier before this many seconds",
        "FLOAT",
    ),
    Option(
        "metrics_port", parse_int, *_fixed(0, "0 (off)"), "port of the Prometheus /metrics endpoint", "INT"
    ),
    Option("metrics_host", parse_str, *_fixed("127.0.0.1"), "address the /metrics endpoint binds", "HOST"),
    Option(
        "max_message_bytes",
        parse_size,
        *_fixed(8 << 20, "8M"),
        "largest gRPC message received or sent",
        "SIZE",
    ),
    Option(
        "stream_chunk_bytes",
        parse_size,
        *_fixed(4 << 20, "4M"),
        "most data bytes in one StreamLoad message",
        "SIZE",
    ),
    Option(
        "torch_threads",
        parse_int,
        *_fixed(1, "1"),
        "torch intra-op threads in the daemon: its copies are memory-bound, and more threads only contend "
        "with the engines on the same host",
        "INT",
    ),
    Option("log_level", parse_log_level, *_fixed("INFO"), "DEBUG, INFO, WARNING, ERROR or CRITICAL", "LEVEL"),
    Option(
        "shared_url",
        parse_str,
        *_fixed("", '"" (off)'),
        "the shared tier: a redis:// or rediss:// URL of one Redis Cluster / Valkey node or plain server "
        '(comma-separated seeds also work; cluster or server is detected; "" for no shared tier)',
        "URL",
    ),
    Option(
        "shared_codec",
        parse_choice(Codec),
        *_fixed(Codec.RAW, "raw"),
        "shared-tier payload codec: raw or zstd",
        "CODEC",
    ),
    Option(
        "shared_timeout_s",
        parse_float,
        *_fixed(0.5, "0.5"),
        "socket timeout of one shared-tier call, seconds: a slower store is turned off with backoff",
        "FLOAT",
    ),
)
_BY_NAME = {opt.name: opt for opt in OPTIONS}


def build_parser(env: Environ | None = None) -> argparse.ArgumentParser:
    """The argparse parser of ``tiercache-daemon``; absent flags are absent from the parsed namespace."""
    env = os.environ if env is None else env
    parser = argparse.ArgumentParser(
        prog="tiercache-daemon",
        description="The tiercache daemon: a tiered KV cache (L1 device memory, L2 shared host memory, "
        "L3 LMDB on disk) served over gRPC to LLM inference engines.",
        epilog="Every option can also be set in the TOML config file (flat table, keys with underscores, "
        f'e.g. slot_bytes = "64M") or as an environment variable {ENV_PREFIX}<OPTION> '
        f"(e.g. {ENV_PREFIX}SLOT_BYTES=64M). Precedence: defaults < config file < environment < flags. "
        "Sizes take binary K/M/G/T suffixes.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"TOML config file (default: ${CONFIG_ENV} if set, else none)",
    )
    known: dict[str, object] = {}
    for opt in OPTIONS:
        doc = opt.doc(env, known).replace("%", "%%")
        known[opt.name] = opt.default(env, known)
        text = f"{opt.help} (default: {doc}; env {opt.env})"
        if opt.boolean:
            parser.add_argument(opt.flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(opt.flag, metavar=opt.metavar, help=text)
    return parser


def _read_config_file(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"{path} is not valid TOML: {exc}") from None
    for key in table:
        if key not in _BY_NAME:
            raise ConfigError(
                "config", f"{path}: unknown option {key!r}; valid: {', '.join(sorted(_BY_NAME))}"
            )
    return dict(table)


def resolve_options(argv: Sequence[str] | None, env: Environ) -> Options:
    """Parse argv, read the config file and the environment, and resolve every option.

    Raises:
        ConfigError: a bad value, naming the option and its source.
        SystemExit: from argparse (``--help``, unknown flags).
    """
    args = vars(build_parser(env).parse_args(argv))
    config_path = cast(str | None, args.pop("config", None)) or env.get(CONFIG_ENV) or ""
    file_values = _read_config_file(config_path) if config_path else {}
    values: dict[str, object] = {}
    for opt in OPTIONS:
        if opt.name in args:
            raw, source = args[opt.name], opt.flag
        elif opt.env in env:
            raw, source = env[opt.env], opt.env
        elif opt.name in file_values:
            raw, source = file_values[opt.name], f"config file {config_path}"
        else:
            values[opt.name] = opt.default(env, values)
            continue
        try:
            values[opt.name] = opt.parse(raw)
        except ValueError as exc:
            raise ConfigError(opt.name, str(exc), source) from None
    return Options(**cast(dict[str, Any], values))


def _cuda_devices(device: str) -> int:
    """CUDA devices on this host; asked only when ``--l1-device`` needs to know."""
    if device in (L1Device.NONE.value, L1Device.CPU.value):
        return 0
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def load_config(argv: Sequence[str] | None = None, env: Environ | None = None) -> DaemonConfig:
    """The validated daemon configuration of argv, the environment and the config file.

    Raises:
        ConfigError: a bad value, naming the option.
        SystemExit: from argparse (``--help``, unknown flags).
    """
    env = os.environ if env is None else env
    opts = resolve_options(argv, env)
    return DaemonConfig.from_options(opts, _cuda_devices(opts.l1_device))

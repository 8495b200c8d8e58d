"""Where ``tiercache-daemon``'s option values come from: flags, environment, TOML file, and the example file.

Every option is declared once, as a field of a config dataclass (:mod:`.config`, :mod:`tiercache.options`);
this module generates from those declarations the argparse parser, the ``TIERCACHE_<NAME>`` variables, the
keys of the TOML file and the example ``daemon/tiercache.toml``. Precedence, lowest first: built-in defaults
< the TOML config file (``--config PATH`` or ``TIERCACHE_CONFIG``; a flat table whose keys are the option
names) < ``TIERCACHE_<NAME>`` environment variables < command-line flags. Some defaults are computed on this
host (socket and L3 paths from the XDG directories, L2 from physical RAM, L3 from free disk space);
``--help`` shows the rule and the value.

Regenerate the example file after changing a declaration::

    python -m tiercache.daemon.options --example-toml > daemon/tiercache.toml

Primitives:
    OPTIONS: every option of :class:`~tiercache.daemon.config.DaemonConfig`, in declaration order.
    CONFIG_ENV: the variable naming the config file.
    build_parser: the argparse parser; ``--help`` lists every option with its default.
    resolve_options: the :class:`~tiercache.options.Values` of argv + environment + file.
    load_config: the validated :class:`~tiercache.daemon.config.DaemonConfig`.
    example_toml: the text of the example config file.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence

from tiercache.options import ENV_PREFIX, UNSET, Option, Values, declared_options, declared_sections

from .config import ConfigError, DaemonConfig
from .parsers import L1Device

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_ENV = ENV_PREFIX + "CONFIG"
"""Environment variable naming the config file when ``--config`` is not given."""
OPTIONS: tuple[Option, ...] = declared_options(DaemonConfig)
"""Every option, in declaration order (derived from the configs' fields; no table of its own)."""
_BY_NAME = {opt.name: opt for opt in OPTIONS}
_WIDTH = 110

Environ = Mapping[str, str]


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
    defaults = Values(OPTIONS, env)
    for opt in OPTIONS:
        text = f"{opt.help} (default: {opt.describe_default(defaults)}; env {opt.env})".replace("%", "%%")
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


def resolve_options(argv: Sequence[str] | None, env: Environ) -> Values:
    """Parse argv, read the config file and the environment, and resolve every option.

    Raises:
        ConfigError: a bad value, naming the option and its source.
        SystemExit: from argparse (``--help``, unknown flags).
    """
    args = vars(build_parser(env).parse_args(argv))
    config_path = str(args.pop("config", "") or env.get(CONFIG_ENV) or "")
    file_values = _read_config_file(config_path) if config_path else {}

    def given(opt: Option) -> object:
        if opt.name in args:
            raw, source = args[opt.name], opt.flag
        elif opt.env in env:
            raw, source = env[opt.env], opt.env
        elif opt.name in file_values:
            raw, source = file_values[opt.name], f"config file {config_path}"
        else:
            return UNSET
        try:
            return opt.parse(raw)
        except ValueError as exc:
            raise ConfigError(opt.name, str(exc), source) from None

    return Values(OPTIONS, env, given)


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
    values = resolve_options(argv, env)
    return DaemonConfig.from_values(values, _cuda_devices(values.get_str("l1_device")))


_EXAMPLE_HEAD = """\
tiercache-daemon configuration: every option the daemon accepts, set to its built-in default.

Use it with `tiercache-daemon --config /etc/tiercache/tiercache.toml` (or TIERCACHE_CONFIG=PATH).
Precedence, lowest first: built-in defaults < this file < TIERCACHE_<OPTION> environment variables <
command-line flags (`--option-name`). Sizes take binary K/M/G/T suffixes ("512M", "2G").
The options whose default is computed on the host at start are commented out: their comment shows the
rule, the line an example value; uncomment a line to pin the value.

Generated from the options' declarations (the config dataclasses' fields) by
    python -m tiercache.daemon.options --example-toml > daemon/tiercache.toml
tests/daemon/test_deploy_files.py fails when this file differs from what that command writes."""


def _comment(text: str) -> list[str]:
    return [
        f"# {line}".rstrip()
        for line in textwrap.wrap(text, _WIDTH - 2, break_on_hyphens=False, break_long_words=False)
    ] or ["#"]


def _title(config: type) -> str:
    paragraph = " ".join((config.__doc__ or "").split("\n\n")[0].split()).replace("``", "")
    return f"{config.__name__}: {paragraph}"


def example_toml() -> str:
    """The example config file: each option with its help, its flag and variable, and its default."""
    examples = Values(
        OPTIONS,
        {},
        lambda opt: opt.computed.example if opt.computed is not None and opt.computed.on_host else UNSET,
    )
    lines = [f"# {line}".rstrip() for line in _EXAMPLE_HEAD.splitlines()]
    for config, options in declared_sections(DaemonConfig):
        lines += ["", "#" * _WIDTH, *_comment(_title(config)), "#" * _WIDTH]
        for opt in options:
            lines += ["", *_comment(f"{opt.help}. {opt.flag}, {opt.env}.")]
            assignment = f"{opt.name} = {opt.toml(examples[opt.name])}"
            if opt.computed is None:
                lines += [f"# default: {opt.describe_default(examples)}"] if opt.note else []
                lines.append(assignment)
                continue
            lines.append(f"# default: {opt.computed.rule}")
            lines.append(f"# {assignment}" if opt.computed.on_host else assignment)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tiercache.daemon.options --example-toml``: print the example config file."""
    parser = argparse.ArgumentParser(
        prog="python -m tiercache.daemon.options", description="Tools over tiercache-daemon's options."
    )
    parser.add_argument("--example-toml", action="store_true", help="print the example daemon/tiercache.toml")
    args = parser.parse_args(argv)
    if not args.example_toml:
        parser.print_help()
        return 2
    sys.stdout.write(example_toml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Option declarations (:mod:`tiercache.options`): every field declared, one declaration per name, computed
defaults in any order, and config errors renamed to the option."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from tiercache.cache import CacheConfig
from tiercache.cache.quotas import TenantQuota
from tiercache.codec import Codec
from tiercache.errors import InvalidArgumentError
from tiercache.options import (
    UNSET,
    Computed,
    Option,
    Values,
    build,
    declared_options,
    declared_sections,
    internal,
    nested,
    option,
    option_fields,
)
from tiercache.parsers import parse_int, parse_size
from tiercache.tiers.hbm import HbmTierConfig
from tiercache.tiers.host import HostTierConfig
from tiercache.tiers.lmdb import LmdbTierConfig
from tiercache.tiers.shared import SharedTierConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CORE_CONFIGS = (CacheConfig, TenantQuota, HbmTierConfig, HostTierConfig, LmdbTierConfig, SharedTierConfig)


@dataclass(frozen=True)
class _Inner:
    size: int = option("size", parse=parse_size, help="a size", default=1 << 20)
    forgotten: int = 3


@dataclass(frozen=True, kw_only=True)
class _Outer:
    count: int = option("count", parse=parse_int, help="a count", default=1)
    inner: _Inner = nested(_Inner)


def test_a_field_without_a_declaration_is_caught_even_nested() -> None:
    with pytest.raises(TypeError, match=r"_Inner\.forgotten is declared neither as an option"):
        declared_options(_Inner)
    with pytest.raises(TypeError, match=r"_Inner\.forgotten"):
        declared_options(_Outer)


@pytest.mark.parametrize("config", CORE_CONFIGS)
def test_every_field_of_the_core_configs_is_declared(config: type) -> None:
    options = declared_options(config)
    assert options and len({opt.name for opt in options}) == len(options)


def test_two_declarations_of_one_name_are_refused_and_one_shared_declaration_is_one_option() -> None:
    @dataclass(frozen=True)
    class Twice:
        a: int = option("n", parse=parse_int, help="a", default=1)
        b: int = option("n", parse=parse_int, help="b", default=2)

    with pytest.raises(TypeError, match="option 'n' is declared twice"):
        declared_options(Twice)
    # slot_bytes is one Option used by the L1 and the L2 configs: one option, in the section of the first.
    assert [f for f, o in option_fields(HbmTierConfig) if o.name == "slot_bytes"] == ["slot_bytes"]

    @dataclass(frozen=True, kw_only=True)
    class Both:
        l1: HbmTierConfig = nested(HbmTierConfig)
        l2: HostTierConfig = nested(HostTierConfig)

    names = [opt.name for opt in declared_options(Both)]
    assert names.count("slot_bytes") == names.count("page_bytes") == 1
    sections = dict(declared_sections(Both))
    assert "slot_bytes" in {o.name for o in sections[HbmTierConfig]}
    assert "slot_bytes" not in {o.name for o in sections[HostTierConfig]}


def test_an_option_needs_a_default_or_a_computed_one() -> None:
    with pytest.raises(TypeError, match="neither a default nor a computed one"):
        Option("x", parse_int, "x")


def test_computed_defaults_read_options_declared_after_them_and_cycles_are_caught() -> None:
    later = Option("later", parse_int, "", computed=Computed(lambda v: v.get_int("base") * 2, "2 * base"))
    base = Option("base", parse_int, "", default=21)
    assert dict(Values((later, base), {})) == {"later": 42, "base": 21}
    given = Values((later, base), {}, lambda opt: 5 if opt.name == "base" else UNSET)
    assert given["later"] == 10  # computed from the given value, not the default
    a = Option("a", parse_int, "", computed=Computed(lambda v: v["b"], "b"))
    b = Option("b", parse_int, "", computed=Computed(lambda v: v["a"], "a"))
    with pytest.raises(TypeError, match="depends on itself"):
        Values((a, b), {})


def test_the_dataclass_default_is_the_options_default() -> None:
    for config in (CacheConfig, TenantQuota):
        made = config()
        for field_name, opt in option_fields(config):
            assert getattr(made, field_name) == opt.default, field_name
    # A required field stays required although the loader has a default ("" means no shared tier).
    with pytest.raises(TypeError):
        SharedTierConfig()  # type: ignore[call-arg]
    url = dict(option_fields(SharedTierConfig))["url"]
    assert url.default == "" and url.describe_default(Values((), {})) == '"" (off)'


def test_build_renames_a_configs_error_to_the_option() -> None:
    values = dict(Values(declared_options(LmdbTierConfig), {"HOME": "/nonexistent"}))
    values["l3_zstd_level"] = 99
    with pytest.raises(InvalidArgumentError, match=r"^l3_zstd_level: must be an integer in") as info:
        build(LmdbTierConfig, values)
    assert info.value.field == "l3_zstd_level"
    values["l3_zstd_level"] = 3
    made = build(LmdbTierConfig, values, recover_damaged=False)
    assert made.zstd_level == 3 and made.recover_damaged is False and made.codec is Codec.RAW


@pytest.mark.parametrize("config", CORE_CONFIGS)
def test_every_default_is_written_as_toml_that_parses_back(config: type) -> None:
    defaults = Values(declared_options(config), {"HOME": "/nonexistent"})
    for opt in declared_options(config):
        if opt.computed is not None and opt.computed.on_host:
            continue
        literal = opt.toml(defaults[opt.name])
        assert opt.parse(tomllib.loads(f"x = {literal}")["x"]) == defaults[opt.name], (opt.name, literal)


def test_an_internal_field_keeps_its_default_and_is_no_option() -> None:
    @dataclass(frozen=True)
    class Config:
        a: int = internal(7)

    assert declared_options(Config) == () and Config().a == 7

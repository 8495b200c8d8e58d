"""Options declared once: a config dataclass's fields carry their flag, environment name, help and parser.

Each field of a component's frozen config dataclass is declared, in its metadata, as one of three kinds: an
option (:func:`option`: a TOML key, which also names its ``--flag`` and its ``TIERCACHE_<NAME>`` variable,
with its parser, help, metavar and default), a sub-config (:func:`nested`) whose options are collected in
turn, or a field that code sets and no user does (:func:`internal`). A field with none of the three is an
error of :func:`declared_options`, so that a new field cannot silently miss the command line, the
environment, the TOML file and its example: the daemon's loader (:mod:`tiercache.daemon.options`) generates
all four from these declarations, and the tokens file's quota tables read the same metadata.

A default that depends on the host or on other options (socket and L3 paths from the XDG directories, L2
from RAM, L3 from free disk, the page size from the slot size) is :class:`Computed`: the function and the
rule that ``--help`` and the example file show. The dataclass field of such an option has no default (or a
plain one for code that builds the config itself); the loader computes the option's.

Primitives:
    Option: one declaration; ``flag``, ``env``, ``boolean``, ``field``, ``loader_default``,
        ``describe_default``, ``show``, ``toml``.
    Computed: a default computed when the options are loaded.
    option, nested, internal: dataclass fields of the three kinds.
    declared_options / declared_sections: the options of a config class and its nested ones, in field
        order (grouped by the class that declares them).
    option_fields: a class's own (field name, Option) pairs.
    Values: the value of every option by name, defaults computed on demand; typed getters.
    build: a config object from Values, errors renamed to the option.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tiercache.errors import InvalidArgumentError
from tiercache.parsers import format_size, parse_bool, parse_octal, parse_size

ENV_PREFIX = "TIERCACHE_"
"""An option ``name`` is read from the environment variable ``TIERCACHE_<NAME>``."""

_OPTION = "tiercache.option"
_NESTED = "tiercache.nested"
_INTERNAL = "tiercache.internal"

C = TypeVar("C")
Environ = Mapping[str, str]


class Unset(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "unset"


UNSET = Unset.UNSET
"""No value: an option without a default, or one that no source gave."""


@dataclass(frozen=True, slots=True)
class Computed:
    """A default computed when the options are loaded.

    Attributes:
        value: the default, from ``values.env`` and the other options (``values.get_int("slot_bytes")``).
        rule: how ``--help`` and the example file describe it.
        on_host: it depends on this host (paths, RAM, disk): ``--help`` adds the value found here, and the
            example file shows ``example`` on a commented-out line.
        example: the value the example file shows for an ``on_host`` default.
    """

    value: Callable[[Values], object]
    rule: str
    on_host: bool = False
    example: object = None


@dataclass(frozen=True, slots=True)
class Option:
    """One option.

    Attributes:
        name: the TOML key; the flag is ``--name-with-dashes``, the variable ``TIERCACHE_NAME``.
        parse: turns a string or a TOML scalar into the typed value (raises ValueError).
        help: what the option does.
        metavar: placeholder in ``--help`` (none for a ``--flag/--no-flag`` switch).
        default: the default, also the dataclass field's unless the field is required; UNSET: computed.
        note: what the default means, shown after it (``0 (off)``).
        computed: the loader's default, when it depends on the host or on other options.
    """

    name: str
    parse: Callable[[object], Any]
    help: str
    metavar: str = ""
    default: object = UNSET
    note: str = ""
    computed: Computed | None = None

    def __post_init__(self) -> None:
        if self.default is UNSET and self.computed is None:
            raise TypeError(f"option {self.name!r} has neither a default nor a computed one")

    @property
    def flag(self) -> str:
        """The command-line flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        """The environment variable."""
        return ENV_PREFIX + self.name.upper()

    @property
    def boolean(self) -> bool:
        """A ``--flag/--no-flag`` switch."""
        return self.parse is parse_bool

    def field(self, *, required: bool = False) -> Any:
        """A dataclass field declared as this option (one option may back fields of several configs).

        Args:
            required: the field has no default even though the option has one (``""`` means "no such
                component" to the loader, but a component that exists needs a real value).
        """
        default = dataclasses.MISSING if required or self.default is UNSET else self.default
        return dataclasses.field(default=default, metadata={_OPTION: self})

    def loader_default(self, values: Values) -> object:
        """The value when no source sets the option."""
        return self.computed.value(values) if self.computed is not None else self.default

    def describe_default(self, values: Values) -> str:
        """The default as ``--help`` shows it: the value and its note, or the rule (and the value here)."""
        if self.computed is not None:
            if self.computed.on_host:
                return f"{self.computed.rule}; here: {self.show(self.computed.value(values))}"
            return self.computed.rule
        shown = self.show(self.default)
        return f"{shown} ({self.note})" if self.note else shown

    def show(self, value: object) -> str:
        """A value as ``--help`` writes it (sizes with binary suffixes, modes in octal)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return str(value.value)
        if isinstance(value, int) and self.parse is parse_size:
            return format_size(value)
        if isinstance(value, int) and self.parse is parse_octal:
            return f"0{value:o}"
        if isinstance(value, float):
            return f"{value:g}"
        return '""' if value == "" else str(value)

    def toml(self, value: object) -> str:
        """A value as a TOML literal that :attr:`parse` reads back."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, enum.Enum):
            return json.dumps(str(value.value))
        if isinstance(value, int) and self.parse is parse_size:
            return json.dumps(format_size(value)) if value else "0"
        if isinstance(value, int) and self.parse is parse_octal:
            return f"0o{value:o}"
        if isinstance(value, (int, float)):
            return repr(value)
        return json.dumps(str(value))


def option(
    name: str,
    *,
    parse: Callable[[object], Any],
    help: str,
    metavar: str = "",
    default: object = UNSET,
    note: str = "",
    computed: Computed | None = None,
    required: bool = False,
) -> Any:
    """A dataclass field declared as an option (see :class:`Option`; ``required``: see :meth:`Option.field`)."""
    declared = Option(name, parse, help, metavar, default, note, computed)
    return declared.field(required=required)


def nested(config: type) -> Any:
    """A required dataclass field holding a sub-config of class ``config``, whose options are collected too."""
    return dataclasses.field(metadata={_NESTED: config})


def internal(default: object = UNSET) -> Any:
    """A dataclass field that is no option: code sets it (``default``, if given, is the field's default)."""
    field_default = dataclasses.MISSING if default is UNSET else default
    return dataclasses.field(default=field_default, metadata={_INTERNAL: True})


def option_fields(config: type) -> tuple[tuple[str, Option], ...]:
    """The (field name, option) pairs of ``config``'s own option fields."""
    return tuple((f.name, f.metadata[_OPTION]) for f in dataclasses.fields(config) if _OPTION in f.metadata)


def _walk(config: type) -> Iterator[tuple[type, Option]]:
    for f in dataclasses.fields(config):
        if _OPTION in f.metadata:
            yield config, f.metadata[_OPTION]
        elif _NESTED in f.metadata:
            yield from _walk(f.metadata[_NESTED])
        elif _INTERNAL not in f.metadata:
            raise TypeError(
                f"{config.__qualname__}.{f.name} is declared neither as an option, a nested config nor an "
                "internal field: use tiercache.options.option(), nested() or internal()"
            )


def declared_sections(config: type) -> tuple[tuple[type, tuple[Option, ...]], ...]:
    """The options of ``config`` and its nested configs, grouped by the class that first uses each.

    Raises:
        TypeError: a field without a declaration, or two options of the same name.
    """
    seen: dict[str, Option] = {}
    sections: dict[type, list[Option]] = {}
    for owner, opt in _walk(config):
        known = seen.get(opt.name)
        if known is opt:
            continue
        if known is not None:
            raise TypeError(f"{owner.__qualname__}: option {opt.name!r} is declared twice")
        seen[opt.name] = opt
        sections.setdefault(owner, []).append(opt)
    return tuple((owner, tuple(opts)) for owner, opts in sections.items())


def declared_options(config: type) -> tuple[Option, ...]:
    """Every option of ``config`` and its nested configs, in field order (see :func:`declared_sections`)."""
    return tuple(opt for _, opts in declared_sections(config) for opt in opts)


class Values(Mapping[str, object]):
    """The value of every option by name: what ``given`` returns, else the option's default.

    Defaults are computed on demand, so that a computed default may read any other option, whatever the
    order of declaration (a cycle is a TypeError).

    Attributes:
        env: the environment the values were resolved in (computed defaults read it).
    """

    def __init__(
        self,
        options: Sequence[Option],
        env: Environ,
        given: Callable[[Option], object] = lambda opt: UNSET,
    ) -> None:
        """Resolve every option; ``given`` returns an option's parsed value from its sources, or UNSET."""
        self.env = env
        self._options = {opt.name: opt for opt in options}
        self._given = given
        self._values: dict[str, object] = {}
        self._resolving: set[str] = set()
        for name in self._options:
            self[name]

    def __getitem__(self, name: str) -> object:
        if name in self._values:
            return self._values[name]
        opt = self._options[name]
        if name in self._resolving:
            raise TypeError(f"the computed default of {name!r} depends on itself")
        self._resolving.add(name)
        try:
            value = self._given(opt)
            self._values[name] = opt.loader_default(self) if value is UNSET else value
        finally:
            self._resolving.discard(name)
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def get_int(self, name: str) -> int:
        """An integer option's value."""
        value = self[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"option {name!r} is {value!r}, not an integer")
        return value

    def get_str(self, name: str) -> str:
        """A string option's value."""
        value = self[name]
        if not isinstance(value, str):
            raise TypeError(f"option {name!r} is {value!r}, not a string")
        return value


def build(config: type[C], values: Mapping[str, object], **given: object) -> C:
    """A ``config`` with each option field set from ``values``, and ``given`` for the other fields.

    Raises:
        InvalidArgumentError: ``config`` refused a value; its field is renamed to the option's name (an
            error of a field that is no option passes unchanged).
    """
    own = option_fields(config)
    kwargs: dict[str, object] = {name: values[opt.name] for name, opt in own}
    kwargs.update(given)
    try:
        return config(**kwargs)
    except InvalidArgumentError as exc:
        opt = dict(own).get(exc.field)
        if opt is None:
            raise
        text, prefix = str(exc), f"{exc.field}: "
        raise InvalidArgumentError(opt.name, text.removeprefix(prefix)) from None

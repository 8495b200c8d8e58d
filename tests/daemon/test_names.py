"""One name per thing: no type of the daemon shares its name with a type of the core (which would mean
another thing: the core's types are what the daemon translates from and to)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tiercache

OUTSIDE_CORE = ("tiercache.daemon", "tiercache.connector", "tiercache.bench", "tiercache.proto")


def _public_types(module_names: list[str]) -> dict[str, str]:
    """Public class name -> the module that defines it."""
    found: dict[str, str] = {}
    for name in module_names:
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == name and not attr.startswith("_"):
                found[attr] = name
    return found


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(tiercache.__path__, "tiercache."))


def test_no_daemon_type_shares_a_name_with_a_core_type() -> None:
    modules = _modules()
    daemon = _public_types([m for m in modules if m.startswith("tiercache.daemon.")])
    core = _public_types([m for m in modules if not m.startswith(OUTSIDE_CORE)])
    assert "KVCacheServicer" in daemon and "CacheManager" in core and "EngineRules" in core
    shared = {name: (daemon[name], core[name]) for name in daemon.keys() & core.keys()}
    assert shared == {}

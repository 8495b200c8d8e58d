"""Per-tenant quotas from the tokens file, and the RPC rate limit (a token bucket per tenant).

Quotas sit next to the tokens, in the same TOML file: ``[quotas.default]`` applies to every tenant, and
``[quotas."team-a"]`` to one (a key it omits inherits the default's). Sizes take the daemon's size syntax
(``"4G"``); every limit is off at 0 (:class:`tiercache.cache.quotas.TenantQuota` declares each key with its
parser and help, and says how capacity is shared under pressure)::

    [quotas.default]
    l2_bytes = "2G"
    l3_bytes = "16G"
    shared_bytes = "8G"
    pinned_bytes = "512M"
    leases = 256
    tickets = 256
    max_ttl_s = 60
    rpc_rate = 2000
    rpc_burst = 4000

    [quotas."team-a"]
    l2_bytes = "8G"

Primitives:
    load_quotas: the :class:`~tiercache.cache.quotas.QuotaTable` of a tokens file.
    parse_quotas: the same, from the file's parsed ``quotas`` table.
    RateLimiter: ``admit(tenant)``: one RPC, or QuotaExceededError naming ``rpc_rate``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping
from types import MappingProxyType

from tiercache.cache.quotas import QuotaExceededError, QuotaTable, TenantQuota
from tiercache.errors import InvalidArgumentError
from tiercache.options import option_fields

from .config import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT = "default"
"""The name of the quota table every tenant starts from."""

_LIMITS = dict(option_fields(TenantQuota))
"""The keys of a quota table: TenantQuota's fields, each declared with its parser."""


def _quota(raw: object, base: TenantQuota, where: str) -> TenantQuota:
    if not isinstance(raw, dict):
        raise ConfigError("tokens_file", f"{where} must be a table of limits")
    unknown = sorted(set(raw) - set(_LIMITS))
    if unknown:
        raise ConfigError("tokens_file", f"{where}: unknown limit(s) {unknown}; valid: {sorted(_LIMITS)}")
    values: dict[str, object] = {}
    for name, value in raw.items():
        try:
            values[name] = _LIMITS[name].parse(value)
        except ValueError as exc:
            raise ConfigError("tokens_file", f"{where}.{name}: {exc}") from None
    try:
        return dataclasses.replace(base, **values)  # type: ignore[arg-type]
    except InvalidArgumentError as exc:
        raise ConfigError("tokens_file", f"{where}.{exc.field}: {exc}") from None


def parse_quotas(table: object, tenants: Collection[str], path: str) -> QuotaTable:
    """The quota table of a tokens file's ``quotas`` table (None or absent: no quotas).

    Raises:
        ConfigError: naming ``tokens_file``, for a malformed table, an unknown limit or a tenant no token
            maps to.
    """
    if table is None:
        return QuotaTable()
    if not isinstance(table, dict):
        raise ConfigError("tokens_file", f"{path}: quotas must be a table of [quotas.<tenant>] tables")
    default = _quota(table.get(DEFAULT, {}), TenantQuota(), f"{path}: quotas.{DEFAULT}")
    per_tenant = {}
    for tenant, raw in table.items():
        if tenant == DEFAULT:
            continue
        if tenant not in tenants:
            raise ConfigError(
                "tokens_file", f"{path}: quotas.{tenant}: no token belongs to tenant {tenant!r}"
            )
        per_tenant[tenant] = _quota(raw, default, f"{path}: quotas.{tenant}")
    return QuotaTable(default, MappingProxyType(per_tenant))


def load_quotas(path: str, tenants: Collection[str]) -> QuotaTable:
    """The quota table of the tokens file at ``path`` (``tenants``: the tenants its tokens name).

    Raises:
        ConfigError: naming ``tokens_file``, as :func:`parse_quotas`, or when the file cannot be read.
    """
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("tokens_file", f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("tokens_file", f"{path} is not valid TOML: {exc}") from None
    return parse_quotas(table.get("quotas"), tenants, path)


class RateLimiter:
    """A token bucket per tenant: ``rpc_rate`` tokens a second, up to ``rpc_burst`` saved. Thread-safe."""

    def __init__(self, quotas: QuotaTable, clock: Callable[[], float] = time.monotonic) -> None:
        """Args: quotas: the tenants' ``rpc_rate`` / ``rpc_burst``; clock: monotonic seconds."""
        self._quotas = quotas
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)
        self.refused: dict[str, int] = {}

    @property
    def refusals(self) -> Mapping[str, int]:
        """RPCs refused per tenant since the start."""
        with self._lock:
            return dict(self.refused)

    def admit(self, tenant: str) -> None:
        """Take one token of ``tenant``'s bucket.

        Raises:
            QuotaExceededError: the bucket is empty (``rpc_rate`` named, with its value).
        """
        quota = self._quotas.of(tenant)
        if not quota.rpc_rate:
            return
        burst = float(quota.rpc_burst or max(1.0, quota.rpc_rate))
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(tenant, (burst, now))
            tokens = min(burst, tokens + (now - at) * quota.rpc_rate)
            if tokens < 1.0:
                self._buckets[tenant] = (tokens, now)
                self.refused[tenant] = self.refused.get(tenant, 0) + 1
                raise QuotaExceededError(
                    tenant,
                    "rpc_rate",
                    quota.rpc_rate,
                    f"more than {burst:g} RPCs at once at {quota.rpc_rate:g}/s",
                )
            self._buckets[tenant] = (tokens - 1.0, now)

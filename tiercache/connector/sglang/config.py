"""The backend's options, parsed from SGLang's ``--hicache-storage-backend-extra-config`` (a JSON object).

SGLang's dynamic factory reads ``backend_name``, ``module_path`` and ``class_name`` from the same object and
its cache controller reads ``interface_v1`` (1: the zero-copy ``batch_get_v1`` / ``batch_set_v1`` calls);
they are accepted here and otherwise ignored. Keys of tiercache's own (all optional):

    address: the daemon (``unix:/path``, ``/path``, ``host:port``); default: the daemon's default socket.
    token: bearer token when the daemon has a tokens file.
    cache_salt: the tenant's cache salt: servers with different salts never share a page.
    model: the model's name in the namespace (default: SGLang's served model name).
    revision: the weights' revision in the namespace ("" for none).
    timeout_s: deadline of each daemon call (default 2).
    data_plane: ``auto`` (default: the daemon's shared memory when it can be mapped here, else the byte
        stream), ``shm`` or ``stream``.

An unknown key or a bad value raises :class:`~tiercache.errors.InvalidArgumentError` naming the key, so that
SGLang fails when it attaches the backend instead of serving without one.

Primitives:
    SglangStorageOptions: the parsed options; ``from_extra_config`` parses and checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiercache.errors import InvalidArgumentError
from tiercache.policies.registry import parse_kind

from ..config import DataPlaneMode
from ..local_daemon import default_socket

DEFAULT_TIMEOUT_S = 2.0
"""Default deadline of a daemon call (a slow daemon never holds SGLang's storage threads longer)."""
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
"""Keys SGLang itself reads from the extra config (accepted, not used here)."""
OWN_KEYS = ("address", "token", "cache_salt", "model", "revision", "timeout_s", "data_plane")
"""tiercache's keys."""


def _string(extra: Mapping[str, object], key: str, default: str, empty_ok: bool) -> str:
    value = extra.get(key, default)
    if not isinstance(value, str) or (not empty_ok and not value):
        what = "a string" if empty_ok else "a non-empty string"
        raise InvalidArgumentError(f"extra_config.{key}", f"must be {what}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SglangStorageOptions:
    """Options of one :class:`~tiercache.connector.sglang.TierCacheStorage`.

    Attributes:
        address: the daemon's address.
        token: bearer token, or None.
        cache_salt: the tenant's cache salt ("" for none).
        model: the model's name in the namespace ("": SGLang's served model name).
        revision: the weights' revision ("" for none).
        timeout_s: deadline of each daemon call.
        data_plane: shared memory, byte stream, or the first of them that works here.
    """

    address: str
    token: str | None = None
    cache_salt: str = ""
    model: str = ""
    revision: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    data_plane: DataPlaneMode = DataPlaneMode.AUTO

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None) -> SglangStorageOptions:
        """Parse SGLang's storage extra config.

        Raises:
            InvalidArgumentError: an unknown key, or a bad value (the field names the key).
        """
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(SGLANG_KEYS) - set(OWN_KEYS))
        if unknown:
            raise InvalidArgumentError(
                f"extra_config.{unknown[0]}", f"unknown key; valid: {', '.join(OWN_KEYS + SGLANG_KEYS)}"
            )
        token = extra.get("token")
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidArgumentError("extra_config.token", f"must be a non-empty string, got {token!r}")
        timeout = extra.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidArgumentError("extra_config.timeout_s", f"must be a number > 0, got {timeout!r}")
        plane = parse_kind(
            DataPlaneMode, extra.get("data_plane", DataPlaneMode.AUTO.value), "extra_config.data_plane"
        )
        return cls(
            address=_string(extra, "address", default_socket(), empty_ok=False),
            token=token,
            cache_salt=_string(extra, "cache_salt", "", empty_ok=True),
            model=_string(extra, "model", "", empty_ok=True),
            revision=_string(extra, "revision", "", empty_ok=True),
            timeout_s=float(timeout),
            data_plane=plane,
        )

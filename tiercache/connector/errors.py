"""gRPC status codes -> typed tiercache errors: the connector's one place for this mapping.

The daemon maps core errors to status codes with a message of the form ``"<field>: <what>"``; this module
maps them back so that callers catch :mod:`tiercache.errors` types, never ``grpc.RpcError``.

Primitives:
    error_from_status: build the typed error for a status code and message.
    error_from_rpc: the same for a raised ``grpc.RpcError`` (or anything else a stub raised).
    field_of: the field a daemon message names (``"handle"`` in ``"handle: unknown handle"``).
    is_lost_handle: True for a NOT_FOUND that means "register again" (the daemon restarted).
"""

from __future__ import annotations

import re

import grpc

from tiercache.errors import (
    CapacityError,
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    TierCacheError,
    UnavailableError,
)

from .control import ControlCallError

_FIELD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\[\]]*)\s*:\s")
_HANDLE_FIELDS = frozenset({"handle", "namespace", "namespace_id"})
_UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
_PERMISSION = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})
_CONFLICT = frozenset(
    {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED, grpc.StatusCode.ALREADY_EXISTS}
)
_INVALID = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})


def field_of(message: str, default: str = "request") -> str:
    """The field a daemon error message names (its ``"<field>: "`` prefix), else ``default``."""
    match = _FIELD.match(message)
    return match.group(1) if match else default


def _strip_field(message: str, field: str) -> str:
    prefix = f"{field}:"
    text = message.strip()
    return text[len(prefix) :].strip() if text.startswith(prefix) else text


def error_from_status(code: grpc.StatusCode | None, message: str, method: str = "") -> TierCacheError:
    """The typed error for a gRPC status.

    Args:
        code: the status code (None when the stub gave none).
        message: the status details.
        method: the RPC name, for the message of errors that carry no field.

    Returns:
        InvalidArgumentError / NotFoundError (with the field the message names), CapacityError,
        ConflictError, PermissionDeniedError, UnavailableError, DeadlineExceededError, or a plain
        TierCacheError for anything else (INTERNAL, UNKNOWN, ...).
    """
    where = f"{method}: " if method else ""
    if code in _INVALID:
        field = field_of(message)
        return InvalidArgumentError(field, _strip_field(message, field))
    if code == grpc.StatusCode.NOT_FOUND:
        field = field_of(message)
        return NotFoundError(field, _strip_field(message, field))
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CapacityError(f"{where}{message}")
    if code in _CONFLICT:
        return ConflictError(f"{where}{message}")
    if code in _PERMISSION:
        return PermissionDeniedError(f"{where}{message}")
    if code in _UNAVAILABLE:
        return UnavailableError(f"{where}daemon unavailable: {message}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceededError(f"{where}deadline exceeded: {message}")
    name = code.name if code is not None else "UNKNOWN"
    return TierCacheError(f"{where}daemon error {name}: {message}")


def error_from_rpc(exc: BaseException, method: str = "") -> TierCacheError:
    """The typed error for an exception raised by a gRPC stub call.

    A ``grpc.RpcError`` that is also a ``grpc.Call`` carries its status code and details; any other
    ``grpc.RpcError`` (e.g. from a closed channel) is treated as UNAVAILABLE.
    """
    if isinstance(exc, TierCacheError):
        return exc
    if isinstance(exc, (grpc.Call, ControlCallError)):
        return error_from_status(exc.code(), exc.details() or "", method)
    if isinstance(exc, grpc.RpcError):
        return UnavailableError(f"{method + ': ' if method else ''}daemon unavailable: {exc!r}")
    return TierCacheError(f"{method + ': ' if method else ''}{exc!r}")


def is_lost_handle(error: TierCacheError) -> bool:
    """True when a NOT_FOUND means the daemon no longer knows the handle (restarted): register again.

    A NOT_FOUND for a ticket or lease id is not one: those die with the daemon and are not retried.
    """
    if not isinstance(error, NotFoundError):
        return False
    return error.field in _HANDLE_FIELDS or (error.field == "request" and "handle" in str(error).lower())

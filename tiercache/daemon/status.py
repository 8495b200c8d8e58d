"""The one place where tiercache errors become gRPC status codes.

=============================== ==================== =========================================
error                            status code          typical cause
=============================== ==================== =========================================
InvalidArgumentError             INVALID_ARGUMENT     a malformed field (the message names it)
ExpiredError                     FAILED_PRECONDITION  a store ticket used after its TTL passed
NotFoundError                    NOT_FOUND            unknown handle, ticket or lease
CapacityError                    RESOURCE_EXHAUSTED   no room in the shared-memory tier
ConflictError                    FAILED_PRECONDITION  the request clashes with the current state
UnauthenticatedError             UNAUTHENTICATED      missing, malformed or unknown bearer token
PermissionDeniedError            PERMISSION_DENIED    credentials not good enough for the call
UnavailableError                 UNAVAILABLE          the daemon is draining or closed
DeadlineExceededError            DEADLINE_EXCEEDED    a server-side wait ran out
=============================== ==================== =========================================

Primitives:
    status_of: the (code, message) of an error.
    abort_with: end a call with the status of an error.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

from tiercache.errors import (
    CapacityError,
    ConflictError,
    DeadlineExceededError,
    ExpiredError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    TierCacheError,
    UnavailableError,
)

from .auth import UnauthenticatedError

# Checked in order: a subclass comes before its base.
_CODES: tuple[tuple[type[TierCacheError], grpc.StatusCode], ...] = (
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (ExpiredError, grpc.StatusCode.FAILED_PRECONDITION),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (CapacityError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ConflictError, grpc.StatusCode.FAILED_PRECONDITION),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def status_of(exc: TierCacheError) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and message of a tiercache error (INTERNAL for an unmapped subclass)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


async def abort_with(context: Any, exc: TierCacheError) -> NoReturn:
    """End the call of ``context`` (a ``grpc.aio.ServicerContext``) with the status of ``exc``.

    Raises:
        grpc.aio.AbortError: always (that is how grpc.aio ends a call).
    """
    code, message = status_of(exc)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover

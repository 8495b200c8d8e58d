"""The error hierarchy of tiercache.

A miss is a return value, never an exception. Exceptions are for bad input, exhausted capacity and misuse;
each carries the name of the offending field so that the daemon can map it to a gRPC status with a clear
message in one place.

Primitives:
    TierCacheError: base of everything tiercache raises on purpose.
    InvalidArgumentError: a value is malformed or out of range (names the field).
    NotFoundError: an unknown namespace, lease or ticket.
    ExpiredError: a store ticket used after its TTL passed (a NotFoundError that says so; names the field).
    CapacityError: a tier cannot make room (everything left is leased, pinned or too young).
    ConflictError: the operation clashes with the current state (e.g. a ticket already committed).
    PermissionDeniedError: missing, unknown or insufficient credentials.
    UnavailableError: the daemon is down, restarting or shutting down (retry later; recompute now).
    DeadlineExceededError: a call did not finish within its deadline.
"""

from __future__ import annotations


class TierCacheError(Exception):
    """Base class of every error tiercache raises on purpose."""


class InvalidArgumentError(TierCacheError, ValueError):
    """A caller-supplied value is malformed or out of range.

    Attributes:
        field: name of the offending argument or field.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotFoundError(TierCacheError, KeyError):
    """An unknown namespace, lease or ticket was referenced."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

    def __str__(self) -> str:
        return str(self.args[0])


class ExpiredError(NotFoundError):
    """A store ticket (or lease) was used after its TTL passed and the cache took its space back.

    Distinct from a plain unknown id so that a late writer is told why; the daemon answers
    FAILED_PRECONDITION.
    """


class CapacityError(TierCacheError):
    """A tier cannot make room for a write (everything evictable is already gone)."""


class ConflictError(TierCacheError):
    """The operation clashes with the current state of the object it targets."""


class PermissionDeniedError(TierCacheError):
    """Missing, unknown or insufficient credentials (another tenant's handle is a NotFoundError: the daemon
    does not tell whether another tenant registered a namespace)."""


class UnavailableError(TierCacheError):
    """The daemon cannot be reached or is shutting down; the engine should recompute and retry later."""


class DeadlineExceededError(TierCacheError):
    """A call did not finish within its deadline."""

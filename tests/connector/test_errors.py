"""gRPC status codes map back to the typed tiercache errors, fields included."""

from __future__ import annotations

import grpc
import pytest

from tiercache.connector.errors import error_from_rpc, error_from_status, field_of, is_lost_handle
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

S = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (S.INVALID_ARGUMENT, InvalidArgumentError),
        (S.OUT_OF_RANGE, InvalidArgumentError),
        (S.NOT_FOUND, NotFoundError),
        (S.RESOURCE_EXHAUSTED, CapacityError),
        (S.FAILED_PRECONDITION, ConflictError),
        (S.ABORTED, ConflictError),
        (S.ALREADY_EXISTS, ConflictError),
        (S.PERMISSION_DENIED, PermissionDeniedError),
        (S.UNAUTHENTICATED, PermissionDeniedError),
        (S.UNAVAILABLE, UnavailableError),
        (S.CANCELLED, UnavailableError),
        (S.DEADLINE_EXCEEDED, DeadlineExceededError),
    ],
)
def test_codes_map_to_typed_errors(code: grpc.StatusCode, kind: type[TierCacheError]) -> None:
    err = error_from_status(code, "keys[2]: must be 32 bytes, got 3", "Lookup")
    assert type(err) is kind
    assert "must be 32 bytes" in str(err)


@pytest.mark.parametrize("code", [S.INTERNAL, S.UNKNOWN, S.UNIMPLEMENTED, S.DATA_LOSS, None])
def test_other_codes_are_plain_tiercache_errors(code: grpc.StatusCode | None) -> None:
    err = error_from_status(code, "boom", "Stats")
    assert type(err) is TierCacheError
    assert "Stats" in str(err) and "boom" in str(err)


def test_fields_survive_the_round_trip() -> None:
    err = error_from_status(S.INVALID_ARGUMENT, "keys[2]: must be 32 bytes, got 3")
    assert isinstance(err, InvalidArgumentError) and err.field == "keys[2]"
    assert str(err) == "keys[2]: must be 32 bytes, got 3"
    nf = error_from_status(S.NOT_FOUND, "ticket_id: store ticket 7 is unknown")
    assert isinstance(nf, NotFoundError) and nf.field == "ticket_id"
    free = error_from_status(S.INVALID_ARGUMENT, "something odd happened")
    assert isinstance(free, InvalidArgumentError) and free.field == "request"
    assert field_of("layout.dtype: unknown") == "layout.dtype"
    assert field_of("no field here") == "request"


def test_lost_handle_detection() -> None:
    assert is_lost_handle(error_from_status(S.NOT_FOUND, "handle: unknown handle 0a1b"))
    assert is_lost_handle(error_from_status(S.NOT_FOUND, "namespace_id: unknown namespace"))
    assert is_lost_handle(error_from_status(S.NOT_FOUND, "unknown handle; register first"))
    assert not is_lost_handle(error_from_status(S.NOT_FOUND, "ticket_id: unknown ticket"))
    assert not is_lost_handle(error_from_status(S.NOT_FOUND, "lease_id: unknown lease"))
    assert not is_lost_handle(error_from_status(S.INVALID_ARGUMENT, "handle: must be 16 bytes"))


class _FakeCall(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> None: ...
    def trailing_metadata(self) -> None: ...
    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None: ...
    def cancel(self) -> None: ...
    def add_callback(self, callback: object) -> None: ...


def test_error_from_rpc() -> None:
    err = error_from_rpc(_FakeCall(S.PERMISSION_DENIED, "handle belongs to another tenant"), "Lookup")
    assert isinstance(err, PermissionDeniedError) and "another tenant" in str(err)
    assert isinstance(error_from_rpc(grpc.RpcError(), "Stats"), UnavailableError)
    typed = UnavailableError("x")
    assert error_from_rpc(typed) is typed

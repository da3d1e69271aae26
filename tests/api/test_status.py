"""The contract's one table between errors.Kind and google.rpc.Code (gateway.api.status):
every kind has its code, the gRPC door's table says the same, and a code read back gives a
kind with that code (codes a gateway never sends stop a batch run as refused)."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2

from gateway.api import status
from gateway.errors import Kind
from gateway.frontends.grpc.status import STATUS
from gateway.jobs.transports.over_grpc import kind_of


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_the_code_of_its_name_on_every_table(kind: Kind) -> None:
    assert status.code_of(kind) == code_pb2.Code.Value(kind.code)
    assert STATUS[kind].value[0] == status.code_of(kind)
    assert status.kind_of(status.code_of(kind)).code == kind.code


def test_codes_read_back() -> None:
    assert status.kind_of(code_pb2.INVALID_ARGUMENT) == Kind.INVALID_INPUT
    assert status.kind_of(code_pb2.FAILED_PRECONDITION) == Kind.BAD_MODEL
    assert status.kind_of(code_pb2.UNAUTHENTICATED) == Kind.PERMISSION_DENIED
    assert status.kind_of(code_pb2.UNIMPLEMENTED) == Kind.PERMISSION_DENIED
    assert status.kind_of(code_pb2.UNKNOWN) == Kind.INTERNAL
    assert status.kind_of(999) == Kind.INTERNAL
    assert kind_of(grpc.StatusCode.RESOURCE_EXHAUSTED) == Kind.OVERLOADED
    assert kind_of(grpc.StatusCode.UNAVAILABLE) == Kind.UNAVAILABLE

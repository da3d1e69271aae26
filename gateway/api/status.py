"""The one table between the error vocabulary (gateway.errors.Kind) and the API's status
codes (google.rpc.Code), for what speaks those codes without being a door: an operation's
error and a result line's (gateway.jobs.spec.conversions), the batch runner reading the
statuses a gateway answers with (gateway.jobs.transports.over_grpc). The doors' own tables
(frontends/grpc/status.py, frontends/http/status.py) agree with it (tests/api/test_status.py)."""

from __future__ import annotations

from google.rpc import code_pb2

from gateway.errors import Kind

# Canonical status names (what Kind.code, logs and result lines hold) -> google.rpc.Code.
CODES: dict[str, int] = dict(code_pb2.Code.items())

# The kind of each code: Kind.code read backwards (for a code two kinds share, the first:
# INVALID_INPUT, not TOO_LARGE; BAD_MODEL, not PRECONDITION), plus the codes a gateway never
# sends but a proxy or another server may (the call is refused: stop).
KINDS: dict[int, Kind] = {
    code_pb2.UNIMPLEMENTED: Kind.PERMISSION_DENIED,
    code_pb2.UNAUTHENTICATED: Kind.PERMISSION_DENIED,
    code_pb2.UNKNOWN: Kind.INTERNAL,
}
for _kind in Kind:
    KINDS.setdefault(CODES[_kind.code], _kind)


def code_of(kind: Kind) -> int:
    """The google.rpc.Code number of a kind."""
    return CODES[kind.code]


def kind_of(code: int) -> Kind:
    """The kind of a google.rpc.Code number (INTERNAL for one the table lacks)."""
    return KINDS.get(code, Kind.INTERNAL)

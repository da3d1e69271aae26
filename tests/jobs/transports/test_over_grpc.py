"""The runner's gRPC transport: what it tells the operator when the gateway closes every
connection as it opens (a TLS mismatch; with TLS 1.3 a refused client certificate is seen
only as a closed socket). The messages are gRPC's own, as the runner gets them from a real
mTLS gateway (tests/security/test_tls_and_hardening.py runs one)."""

from __future__ import annotations

from gateway.jobs.transports.over_grpc import connection_hint
from gateway.tls import TLS

CLOSED = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:4317: "
    "Socket closed"
)
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:4317: "
    "Failed to connect to remote host: Connection refused"
)


def test_a_closed_connection_names_what_to_check_for_each_tls_setup() -> None:
    assert "pass --tls or --ca-file" in connection_hint(CLOSED, None)
    no_certificate = connection_hint(CLOSED, TLS(ca_file="ca.pem"))
    assert "pass --cert-file and --key-file" in no_certificate
    with_certificate = connection_hint(CLOSED, TLS("ca.pem", "client.pem", "client.key"))
    assert "GATEWAY_TLS_CLIENT_CA_FILE" in with_certificate


def test_a_gateway_that_is_down_gets_no_tls_hint() -> None:
    assert connection_hint(REFUSED, None) == ""
    assert connection_hint(REFUSED, TLS("ca.pem", "client.pem", "client.key")) == ""

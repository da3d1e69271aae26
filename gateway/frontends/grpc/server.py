"""The gRPC door: server options, TLS, servicers, health and reflection on one grpc.aio server."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway.config import Settings
from gateway.core.pipeline import Pipeline
from gateway.frontends.grpc import jobs as jobs_door
from gateway.frontends.grpc.health import HealthStatuses
from gateway.frontends.grpc.servicers import (
    CLASSIFICATION_SERVICE,
    DETECTION_SERVICE,
    ClassificationServicer,
    DetectionServicer,
)
from gateway.jobs.service import JobService
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.upstream.client import read_pem

SERVICES = (DETECTION_SERVICE, CLASSIFICATION_SERVICE)


def server_options(settings: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", settings.server_max_receive_bytes),
        # Results are small; unlimited send like gRPC's default, stated for clarity.
        ("grpc.max_send_message_length", -1),
    ]


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS for the gateway's port (mTLS with a client CA); None for plaintext."""
    if not settings.tls_cert_file:
        return None
    cert = read_pem(settings.tls_cert_file, "tls-cert-file")
    key = read_pem(settings.tls_key_file, "tls-key-file")
    client_ca = None
    if settings.tls_client_ca_file:
        client_ca = read_pem(settings.tls_client_ca_file, "tls-client-ca-file")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


@dataclass
class GrpcDoor:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    statuses: HealthStatuses


def build(settings: Settings, pipeline: Pipeline, jobs: JobService | None = None) -> GrpcDoor:
    """The server with every service added and its port bound (not started yet)."""
    credentials = server_credentials(settings)  # before anything starts: bad files fail fast
    server = grpc.aio.server(options=server_options(settings))
    pb_grpc.add_DetectionServiceServicer_to_server(DetectionServicer(pipeline), server)
    cpb_grpc.add_ClassificationServiceServicer_to_server(ClassificationServicer(pipeline), server)
    # Batch jobs over the API (BatchService + google.longrunning.Operations), when enabled.
    job_services = jobs_door.add_services(server, jobs) if jobs is not None else ()
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICES, *job_services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{settings.host}:{settings.port}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    return GrpcDoor(server, port, health_servicer, HealthStatuses(health_servicer, SERVICES))

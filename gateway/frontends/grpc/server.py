"""The gRPC door: server options, TLS, servicers, health and reflection on one grpc.aio server.

Reflection is served as `grpc.reflection.v1.ServerReflection` (what current grpcurl, grpcui
and Postman ask for first) and as the older `grpc.reflection.v1alpha.ServerReflection`.
grpcio-reflection 1.85 ships only v1alpha; v1's messages are wire-identical (same fields,
numbers and types, only the package differs), so one servicer answers both, and v1's file
descriptor is derived from v1alpha's so `describe` finds v1 as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from gateway.api.bindings import Bindings
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.frontends.grpc import job_servicers as jobs_door
from gateway.frontends.grpc.health import HealthServicer, HealthStatuses
from gateway.frontends.grpc.pipeline_servicer import add_pipeline_service
from gateway.frontends.grpc.servicers import Drain, add_task_services
from gateway.jobs.control.service import JobService
from gateway.tls import server_credentials

REFLECTION_V1ALPHA = reflection.SERVICE_NAME
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
_V1_PACKAGE = "grpc.reflection.v1"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _register_reflection_v1(pool: descriptor_pool.DescriptorPool) -> None:
    """Adds grpc/reflection/v1/reflection.proto to `pool`, made from v1alpha's descriptor
    (package and type references renamed), unless the pool has it already."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = _V1_FILE
    file.package = _V1_PACKAGE
    file.options.Clear()  # v1alpha's options name its own Java/C# packages
    old, new = f".{_V1ALPHA_PACKAGE}.", f".{_V1_PACKAGE}."
    for message in file.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new)
    for service in file.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.AddSerializedFile(file.SerializeToString())


def add_reflection(server: grpc.aio.Server, service_names: tuple[str, ...]) -> None:
    """Reflection v1 and v1alpha for `service_names` (both reflection services are added to
    the list) on `server`."""
    pool = descriptor_pool.Default()
    _register_reflection_v1(pool)
    names = (*service_names, REFLECTION_V1, REFLECTION_V1ALPHA)
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection.enable_server_reflection(names, server, pool=pool)  # v1alpha
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


def server_options(settings: Settings) -> list[tuple[str, int]]:
    options = [
        ("grpc.max_receive_message_length", settings.server_max_receive_bytes),
        # Results are small; unlimited send like gRPC's default, stated for clarity.
        ("grpc.max_send_message_length", -1),
        # What one connection may hold (Settings explains each value).
        ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(settings.grpc_min_ping_interval)),
        ("grpc.keepalive_permit_without_calls", 1),
        # The same soft and hard limit: every call over it is refused, none below it.
        ("grpc.max_metadata_size", settings.grpc_max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", settings.grpc_max_metadata_bytes),
    ]
    if settings.grpc_max_connection_age:
        options += [
            ("grpc.max_connection_age_ms", _ms(settings.grpc_max_connection_age)),
            ("grpc.max_connection_age_grace_ms", _ms(settings.grpc_max_connection_age_grace)),
        ]
    return options


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass
class GrpcDoor:
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    statuses: HealthStatuses
    drain: Drain


def build(
    settings: Settings,
    pipeline: Pipeline,
    bindings: Bindings,
    jobs: JobService | None = None,
    cascades: Cascades | None = None,
) -> GrpcDoor:
    """The server with every service added and its port bound (not started yet)."""
    credentials = server_credentials(settings)  # before anything starts: bad files fail fast
    drain = Drain()
    server = grpc.aio.server(options=server_options(settings))
    services = add_task_services(server, bindings, pipeline, drain)
    if cascades is not None and cascades.names:  # pipeline.v1, when the config has pipelines
        services = (*services, add_pipeline_service(server, cascades, bindings, drain))
    # Batch jobs over the API (BatchService + google.longrunning.Operations), when enabled.
    job_services = jobs_door.add_services(server, jobs) if jobs is not None else ()
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_reflection(server, (*services, *job_services, health.SERVICE_NAME))
    address = f"{settings.host}:{settings.port}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    statuses = HealthStatuses(health_servicer, services)
    return GrpcDoor(server, port, health_servicer, statuses, drain)

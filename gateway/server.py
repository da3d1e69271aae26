"""Builds and runs the gateway: gRPC server, health, reflection, metrics, graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gateway import metrics
from gateway.config import Settings
from gateway.health import HealthReporter
from gateway.labelmap import LabelMap
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.service import SERVICE_NAME, DetectionService
from gateway.tfserving import TFServingClient, read_pem

log = logging.getLogger("gateway.server")


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


def load_label_maps(paths: dict[str, Path]) -> dict[str, LabelMap]:
    return {name: LabelMap.load(path) for name, path in paths.items()}


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Runs until SIGTERM/SIGINT, then lets in-flight requests finish within the grace."""
    label_maps = load_label_maps(dict(settings.label_maps))
    credentials = server_credentials(settings)  # before anything starts: bad files fail fast
    executor = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
    client = TFServingClient(settings)
    server = grpc.aio.server(options=server_options(settings))
    pb_grpc.add_DetectionServiceServicer_to_server(
        DetectionService(settings, client, label_maps, executor), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{settings.host}:{settings.port}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    metrics.serve(settings.metrics_port, settings.host)
    await server.start()
    reporter = HealthReporter(
        health_servicer, client, settings.model, (SERVICE_NAME,), settings.health_interval
    )
    health_task = asyncio.create_task(reporter.run())
    log.info(
        "gateway listening",
        extra={
            "fields": {
                "address": f"{settings.host}:{port}",
                "upstream": settings.upstream,
                "model": settings.model,
                "metrics_port": settings.metrics_port,
                "tls": _tls_mode(settings.tls_cert_file, settings.tls_client_ca_file),
                "upstream_tls": _tls_mode(settings.upstream_uses_tls, settings.upstream_cert_file),
            }
        },
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()

    log.info("shutting down", extra={"fields": {"grace_seconds": settings.shutdown_grace}})
    # Readiness goes NOT_SERVING first so load balancers stop sending new work, then the
    # server refuses new RPCs and waits for the in-flight ones up to the grace period.
    await health_servicer.enter_graceful_shutdown()
    health_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await health_task
    await server.stop(settings.shutdown_grace)
    await client.close()
    executor.shutdown(wait=False, cancel_futures=True)
    log.info("stopped")


def _tls_mode(tls: object, mutual: object) -> str:
    """off, tls, or mtls (both sides present certificates), for the startup log."""
    return "mtls" if tls and mutual else "tls" if tls else "off"

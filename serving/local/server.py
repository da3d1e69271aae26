"""Startup, the gRPC server and shutdown, in the order of TF Serving's Server::BuildAndStart.

Startup checks the flags, reads the config files, loads every model (the port opens only
when all of them are AVAILABLE), then serves until SIGTERM/SIGINT and stops gracefully.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
import tensorflow as tf
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from serving.local import config
from serving.local.core import CoreOptions, ServingCore
from serving.local.errors import ServingError, invalid_argument, report_startup_failure
from serving.local.flags import Options, parse_channel_arguments
from serving.local.manager import ManagerSettings, ModelManager, Stopped
from serving.local.servicers import ModelServicer, PredictionServicer
from serving.local.signals import watch_stop_signals

log = logging.getLogger(__name__)

BIND_HOST_ENV = "TFS_LOCAL_BIND_HOST"
DEFAULT_BIND_HOST = "0.0.0.0"  # TF Serving listens on all interfaces
# In-flight RPCs get this long to finish after SIGTERM/SIGINT (Kubernetes then kills).
SHUTDOWN_GRACE_SECONDS = 5.0
# TF Serving's builder.SetMaxMessageSize(INT32_MAX) sets the receive limit; send stays
# unlimited (gRPC's default). Reuseport off so a taken port fails loudly instead of two
# servers sharing it.
_BASE_CHANNEL_OPTIONS: dict[str, int | str] = {
    "grpc.max_receive_message_length": 2**31 - 1,
    "grpc.max_send_message_length": -1,
    "grpc.so_reuseport": 0,
}
_HEALTH_SERVICES = ("", "ModelService", "PredictionService")


@dataclass
class _Running:
    """What a started server consists of, for shutdown."""

    server: grpc.Server
    health: health.HealthServicer | None
    config_poller: threading.Thread | None


def serve(options: Options, startup: config.StartupConfig) -> int:
    """Loads the models and serves until a signal; returns the process exit code."""
    tf.get_logger().setLevel(logging.ERROR)  # the v1 loader's deprecation warnings
    stop = threading.Event()
    manager = ModelManager(_manager_settings(options, startup))

    def on_stop() -> None:
        stop.set()
        manager.interrupt()  # also ends a startup that is still loading or waiting

    watch_stop_signals(on_stop)
    try:
        running = _start(options, startup, manager, stop)
    except ServingError as exc:
        manager.stop()
        return report_startup_failure(exc)
    except Stopped:
        manager.stop()
        return 0
    stop.wait()
    _shutdown(running, manager)
    return 0


def _manager_settings(options: Options, startup: config.StartupConfig) -> ManagerSettings:
    return ManagerSettings(
        session=startup.session,
        file_system_poll_wait_seconds=options.file_system_poll_wait_seconds,
        enable_model_warmup=options.enable_model_warmup,
        num_request_iterations_for_warmup=options.num_request_iterations_for_warmup,
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_micros=options.load_retry_interval_micros,
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models
        ),
        check_method_name=options.enable_signature_method_name_check,
        batching=startup.batching,
    )


def _start(
    options: Options,
    startup: config.StartupConfig,
    manager: ModelManager,
    stop: threading.Event,
) -> _Running:
    """Loads the models (blocking), then opens the port."""
    manager.reload_config(startup.models)
    manager.start_polling()
    core = ServingCore(
        manager,
        CoreOptions(
            as_tensor_content=options.enable_serialization_as_tensor_content,
            check_method_name=options.enable_signature_method_name_check,
        ),
    )
    server, health_servicer = _grpc_server(options, core)
    poller = _start_config_poller(options, manager, stop)
    return _Running(server, health_servicer, poller)


def _grpc_server(
    options: Options, core: ServingCore
) -> tuple[grpc.Server, health.HealthServicer | None]:
    channel_options = dict(_BASE_CHANNEL_OPTIONS)
    channel_options.update(parse_channel_arguments(options.grpc_channel_arguments))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads, thread_name_prefix="grpc"),
        options=list(channel_options.items()),
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(core), server
    )
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(core), server)
    health_servicer = None
    if options.enable_grpc_healthcheck_service:
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host = os.environ.get(BIND_HOST_ENV, DEFAULT_BIND_HOST)
    address = f"{host}:{options.port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as exc:
        log.error("Cannot listen on %s: %s", address, exc)
        raise invalid_argument("Failed to BuildAndStart gRPC server") from None
    server.start()
    if health_servicer is not None:
        for service in _HEALTH_SERVICES:
            health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("Running gRPC ModelServer at %s ...", address)
    return server, health_servicer


def _start_config_poller(
    options: Options, manager: ModelManager, stop: threading.Event
) -> threading.Thread | None:
    """Re-reads --model_config_file every --model_config_file_poll_wait_seconds."""
    period = options.model_config_file_poll_wait_seconds
    if period <= 0 or not options.model_config_file:
        return None

    def poll() -> None:
        while not stop.wait(period):
            try:
                models = config.read_model_configs(options)
            except ServingError as exc:
                log.error("Failed to read ModelServerConfig file: %s", exc.message)
                continue
            try:
                manager.reload_config(models)
            except Stopped:
                return
            except ServingError as exc:
                log.error("PollFilesystemAndReloadConfig failed to ReloadConfig: %s", exc.message)

    thread = threading.Thread(target=poll, name="config-poll", daemon=True)
    thread.start()
    return thread


def _shutdown(running: _Running, manager: ModelManager) -> None:
    """Stops taking RPCs, lets running ones finish (grace period), then unloads models."""
    if running.health is not None:
        running.health.enter_graceful_shutdown()
    running.server.stop(SHUTDOWN_GRACE_SECONDS).wait()
    if running.config_poller is not None:
        running.config_poller.join()
    manager.stop()
    log.info("Server stopped")

"""Config files: the model list, batching parameters and monitoring config.

All three are text-format protos parsed with google.protobuf.text_format into TF Serving's
own message types, with TF Serving's validation rules and error texts (server.cc,
server_core.cc, bundle_factory_util.cc).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message
from tensorflow_serving.config import model_server_config_pb2
from tensorflow_serving.config.model_server_config_pb2 import ModelConfig

from serving.local import protos
from serving.local.errors import invalid_argument, not_found
from serving.local.flags import Options

log = logging.getLogger(__name__)

TENSORFLOW_PLATFORM = "tensorflow"
# TF Serving's thread pool name when batching is on without a parameters file (server.cc).
DEFAULT_BATCH_THREAD_POOL = "model_server_batch_threads"
# SharedBatchScheduler's default max batch size (input_batch_size_limit).
DEFAULT_MAX_BATCH_SIZE = 1000

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class SessionSettings:
    """Session options from the flags (server.cc's SessionBundleConfig)."""

    tags: tuple[str, ...]
    intra_op_threads: int = 0
    inter_op_threads: int = 0


@dataclass(frozen=True)
class StartupConfig:
    """Everything read and checked before TensorFlow is imported."""

    models: list[ModelConfig]
    batching: Message | None
    session: SessionSettings


def read_startup_config(options: Options) -> StartupConfig:
    """The checks of Server::BuildAndStart before models load, in its order.

    Raises ServingError with TF Serving's texts (printed as "Failed to start server").
    """
    if options.port == 0:
        raise invalid_argument(
            "At least one of server_options.grpc_port or server_options.grpc_socket_path "
            "must be set."
        )
    if not options.model_base_path and not options.model_config_file:
        raise invalid_argument(
            "Both server_options.model_base_path and server_options.model_config_file are empty!"
        )
    models = read_model_configs(options)
    batching = read_batching_parameters(options)
    session = session_settings(options)
    read_monitoring_config(options)
    return StartupConfig(models, batching, session)


def session_settings(options: Options) -> SessionSettings:
    """Session threads and tags as server.cc derives them from the flags."""
    intra = options.tensorflow_intra_op_parallelism
    inter = options.tensorflow_inter_op_parallelism
    both = options.tensorflow_session_parallelism
    if intra > 0 and inter > 0 and both > 0:
        raise invalid_argument(
            "Either configure server_options.tensorflow_session_parallelism or "
            "(server_options.tensorflow_intra_op_parallelism, "
            "server_options.tensorflow_inter_op_parallelism) separately. You cannot "
            "configure all."
        )
    if intra <= 0 and inter <= 0:
        intra = inter = both
    tags = tuple(options.saved_model_tags.split(","))
    return SessionSettings(tags=tags, intra_op_threads=intra, inter_op_threads=inter)


def read_text_proto(path: str, message: M) -> M:
    """Parses a text-format proto file like TF Serving's ParseProtoTextFile."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise not_found(f"{path}; No such file or directory") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        # TF Serving logs the parser's detail (via libprotobuf) and returns a short status.
        log.error("Error parsing text-format %s: %s", message.DESCRIPTOR.full_name, exc)
        raise invalid_argument(f"Invalid protobuf file: '{path}'") from None
    return message


def read_model_configs(options: Options) -> list[ModelConfig]:
    """The validated model list from --model_config_file or --model_name/--model_base_path."""
    if options.model_config_file:
        config = read_text_proto(
            options.model_config_file, model_server_config_pb2.ModelServerConfig()
        )
    else:
        log.info(
            "Building single TensorFlow model file config:  model_name: %s model_base_path: %s",
            options.model_name,
            options.model_base_path,
        )
        config = model_server_config_pb2.ModelServerConfig()
        config.model_config_list.config.add(
            name=options.model_name,
            base_path=options.model_base_path,
            model_platform=TENSORFLOW_PLATFORM,
        )
    return model_configs_from(config)


def model_configs_from(config: model_server_config_pb2.ModelServerConfig) -> list[ModelConfig]:
    """Validates a ModelServerConfig and returns its models with absolute base paths."""
    case = config.WhichOneof("config")
    if case == "custom_model_config":
        raise invalid_argument("ModelServer does not yet support custom model config.")
    if case is None:
        log.info("Taking no action for empty config.")
        return []
    models = [_resolved(model) for model in config.model_config_list.config]
    names: set[str] = set()
    for model in models:
        if model.name in names:
            raise invalid_argument(
                f"Illegal to list model {model.name} multiple times in config list"
            )
        names.add(model.name)
        platform = _platform(model)
        if platform != TENSORFLOW_PLATFORM:
            raise invalid_argument(f"Model {model.name} requests unsupported platform {platform}")
    return models


def _platform(model: ModelConfig) -> str:
    """ServerCore's GetPlatform, including the deprecated model_type field."""
    if model.model_type != model_server_config_pb2.MODEL_TYPE_UNSPECIFIED:
        if model.model_platform:
            raise invalid_argument(
                "Illegal setting both ModelServerConfig::model_type (deprecated) and "
                f"ModelServerConfig::model_platform, model name is {model.name}"
            )
        if model.model_type == model_server_config_pb2.TENSORFLOW:
            return TENSORFLOW_PLATFORM
        raise invalid_argument(
            f"ModelServerConfig::model_type choice {model.model_type} not supported."
        )
    if not model.model_platform:
        raise invalid_argument(
            "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
            f"ModelServerConfig::model_platform, model name is {model.name}"
        )
    return str(model.model_platform)


def _resolved(model: ModelConfig) -> ModelConfig:
    """A copy whose base_path is absolute.

    TF Serving rejects relative base paths; the local server resolves them against the
    working directory so that one config file works from the repository root.
    """
    if "://" in model.base_path:
        raise invalid_argument(
            f"Model {model.name} has base_path {model.base_path}; the local server reads "
            "local directories only"
        )
    resolved = ModelConfig()
    resolved.CopyFrom(model)
    resolved.base_path = os.path.abspath(model.base_path) if model.base_path else ""
    return resolved


def read_batching_parameters(options: Options) -> Message | None:
    """BatchingParameters when --enable_batching is set, validated like TF Serving at startup."""
    if not options.enable_batching:
        if options.batching_parameters_file:
            raise invalid_argument(
                "server_options.batching_parameters_file is set without setting "
                "server_options.enable_batching to true."
            )
        return None
    params = protos.BatchingParameters()
    if options.batching_parameters_file:
        read_text_proto(options.batching_parameters_file, params)
    else:
        params.thread_pool_name.value = DEFAULT_BATCH_THREAD_POOL  # type: ignore[attr-defined]
    if params.HasField("num_batch_threads") and params.num_batch_threads.value < 1:  # type: ignore[attr-defined]
        raise invalid_argument(
            f"num_batch_threads must be positive; was {params.num_batch_threads.value}"  # type: ignore[attr-defined]
        )
    log.info(
        "Batching parameters accepted; the local server runs every request unbatched: %s",
        text_format.MessageToString(params, as_one_line=True),
    )
    return params


def check_allowed_batch_sizes(params: Message) -> None:
    """The check TF Serving runs when it wraps each loaded session for batching."""
    allowed = list(params.allowed_batch_sizes)  # type: ignore[attr-defined]
    if not allowed:
        return
    max_size = (
        params.max_batch_size.value  # type: ignore[attr-defined]
        if params.HasField("max_batch_size")
        else DEFAULT_MAX_BATCH_SIZE
    )
    if allowed[-1] != max_size:
        raise invalid_argument(
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
            f"{allowed[-1]}; expected {max_size}"
        )


def read_monitoring_config(options: Options) -> Message | None:
    """Parses --monitoring_config_file so that mistakes surface; metrics are not exported.

    TF Serving serves Prometheus metrics on the REST port only, which the local server
    does not have.
    """
    if not options.monitoring_config_file:
        return None
    config = read_text_proto(options.monitoring_config_file, protos.MonitoringConfig())
    log.info(
        "Monitoring config parsed (%s); metrics are not exported because the local server "
        "has no REST port",
        text_format.MessageToString(config, as_one_line=True),
    )
    return config

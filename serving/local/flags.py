"""Command-line flags: tensorflow_model_server's names, defaults and meanings.

Accepts `--flag=value` and `--flag value`; booleans as `--flag` or `--flag=true|false`.
tensorflow_model_server flags that the local server does not implement are refused by
name, so a command line that works here means the same thing to the real server.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

# tensorflow_model_server's default for --grpc_max_threads is 4 x schedulable CPUs (server.h).
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _default_grpc_max_threads() -> int:
    return 4 * (_CPUS or 1)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class Options:
    """The parsed command line. Field names are the flag names; defaults are TF Serving's."""

    port: int = field(default=8500, metadata=_help("gRPC port (0 disables gRPC, as in TFS)"))
    rest_api_port: int = field(default=0, metadata=_help("must stay 0: no REST API here"))
    model_name: str = field(default="default", metadata=_help("model name (single-model mode)"))
    model_base_path: str = field(
        default="", metadata=_help("directory holding numeric version dirs (single-model mode)")
    )
    model_config_file: str = field(
        default="", metadata=_help("text-format ModelServerConfig with model_config_list")
    )
    model_config_file_poll_wait_seconds: int = field(
        default=0, metadata=_help("re-read --model_config_file every N s (0: read once)")
    )
    file_system_poll_wait_seconds: int = field(
        default=1, metadata=_help("scan base paths for versions every N s (0: once)")
    )
    enable_model_warmup: bool = field(
        default=True, metadata=_help("replay assets.extra/tf_serving_warmup_requests at load")
    )
    num_request_iterations_for_warmup: int = field(
        default=0, metadata=_help("times each warmup record is run (0 means 1)")
    )
    enable_batching: bool = field(
        default=False, metadata=_help("accepted and validated; requests still run unbatched")
    )
    batching_parameters_file: str = field(
        default="", metadata=_help("text-format BatchingParameters (needs --enable_batching)")
    )
    monitoring_config_file: str = field(
        default="", metadata=_help("text-format MonitoringConfig (parsed and validated only)")
    )
    grpc_channel_arguments: str = field(
        default="", metadata=_help("comma-separated key=value gRPC server arguments")
    )
    grpc_max_threads: int = field(
        default_factory=_default_grpc_max_threads,
        metadata=_help("gRPC worker threads (default 4 x CPUs)"),
    )
    saved_model_tags: str = field(
        default="serve", metadata=_help("comma-separated MetaGraphDef tags to load")
    )
    enable_serialization_as_tensor_content: bool = field(
        default=False, metadata=_help("write Predict outputs as tensor_content bytes")
    )
    allow_version_labels_for_unavailable_models: bool = field(
        default=False, metadata=_help("allow new labels on versions that are not loaded yet")
    )
    enable_signature_method_name_check: bool = field(
        default=False, metadata=_help("require predict/classify/regress method names")
    )
    enable_grpc_healthcheck_service: bool = field(
        default=False, metadata=_help("serve grpc.health.v1 (ModelService, PredictionService)")
    )
    tensorflow_session_parallelism: int = field(
        default=0, metadata=_help("intra- and inter-op threads (0: auto)")
    )
    tensorflow_intra_op_parallelism: int = field(
        default=0, metadata=_help("intra-op threads (0: auto)")
    )
    tensorflow_inter_op_parallelism: int = field(
        default=0, metadata=_help("inter-op threads (0: auto)")
    )
    max_num_load_retries: int = field(
        default=5, metadata=_help("load retries after a failed load (0: try once)")
    )
    load_retry_interval_micros: int = field(
        default=60_000_000, metadata=_help("wait between load retries (negative: no wait)")
    )
    version: bool = field(default=False, metadata=_help("print the version and exit"))


# tensorflow_model_server flags (main.cc) that the local server refuses, with a hint each.
UNSUPPORTED_FLAGS: dict[str, str] = {
    "grpc_socket_path": "serve on --port instead",
    "rest_api_num_threads": "the REST API is not supported by the local server",
    "rest_api_timeout_in_ms": "the REST API is not supported by the local server",
    "rest_api_enable_cors_support": "the REST API is not supported by the local server",
    "enable_per_model_batching_parameters": "requests run unbatched here",
    "num_load_threads": "versions load one at a time",
    "num_unload_threads": "versions unload one at a time",
    "flush_filesystem_caches": "there are no file-system caches to flush",
    "per_process_gpu_memory_fraction": "the local server runs on CPU",
    "use_alts_credentials": "the local server serves plaintext gRPC only",
    "ssl_config_file": "the local server serves plaintext gRPC only",
    "platform_config_file": "only the TensorFlow SavedModel platform is served",
    "tensorflow_session_config_file": "use the *_parallelism flags",
    "thread_pool_factory_config_file": "requests use TensorFlow's default thread pools",
    "mixed_precision": "models run as exported",
    "xla_cpu_compilation_enabled": "XLA JIT is not configurable here",
    "xla_gpu_compilation_enabled": "XLA JIT is not configurable here",
    "enable_profiler": "there is no profiler service",
    "prefer_tflite_model": "only SavedModels are served",
    "num_tflite_pools": "only SavedModels are served",
    "num_tflite_interpreters_per_pool": "only SavedModels are served",
    "remove_unused_fields_from_bundle_metagraph": "the MetaGraphDef is kept as loaded",
    "skip_initialize_tpu": "the local server runs on CPU",
}

_FLAG_TYPES: dict[str, str] = {f.name: str(f.type) for f in fields(Options)}
_INT_LIMITS = {
    # int64 in TF Serving; every other integer flag is int32.
    "load_retry_interval_micros": 2**63,
}
_TRUE = ("true", "1")
_FALSE = ("false", "0")


class FlagError(ValueError):
    """A command line the local server cannot run with (exit code 2)."""


class HelpRequested(Exception):
    """`--help` was given."""


def parse_flags(argv: Sequence[str]) -> Options:
    """Parses and validates the command line (without the program name)."""
    values: dict[str, object] = {}
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help", "--helpfull"):
            raise HelpRequested()
        if not arg.startswith("--") or arg == "--":
            raise FlagError(f"unknown argument: {arg}")
        name, has_value, value = arg[2:].partition("=")
        _check_known(name)
        kind = _FLAG_TYPES[name]
        if not has_value:
            if kind == "bool":
                value = "true"
            elif args:
                value = args.pop(0)
            else:
                raise FlagError(f"--{name} needs a value")
        values[name] = _convert(name, kind, value)
    options = Options(**values)  # type: ignore[arg-type]
    _validate(options)
    return options


def usage(program: str = "python -m serving.local") -> str:
    """Help text listing the supported and refused flags."""
    lines = [f"usage: {program} [--flag=value ...]", "", "Flags (tensorflow_model_server's):"]
    for f in fields(Options):
        default = getattr(Options(), f.name)
        lines.append(f"  --{f.name} ({f.type}, default {default!r}): {f.metadata['help']}")
    lines.append("")
    lines.append("Refused (tensorflow_model_server flags the local server does not implement):")
    lines.append("  " + " ".join(f"--{name}" for name in UNSUPPORTED_FLAGS))
    return "\n".join(lines)


def parse_channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """Parses --grpc_channel_arguments like TF Serving: values that fit int32 become ints."""
    result: list[tuple[str, int | str]] = []
    for item in text.split(","):
        if not item:
            continue
        key, has_value, value = item.partition("=")
        if not has_value or not key:
            raise FlagError(
                f"--grpc_channel_arguments entry {item!r} is not key=value "
                "(example: grpc.max_connection_age_ms=2000)"
            )
        result.append((key, _int32_or_str(value)))
    return result


def _int32_or_str(value: str) -> int | str:
    try:
        number = int(value)
    except ValueError:
        return value
    return number if -(2**31) <= number < 2**31 else value


def _check_known(name: str) -> None:
    if name in UNSUPPORTED_FLAGS:
        raise FlagError(
            f"--{name} is a tensorflow_model_server flag that is not supported by the local "
            f"server ({UNSUPPORTED_FLAGS[name]}); remove it to run serving.local"
        )
    if name not in _FLAG_TYPES:
        raise FlagError(f"unknown flag --{name}; see --help for the supported flags")


def _convert(name: str, kind: str, value: str) -> object:
    if kind == "bool":
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise FlagError(f"invalid value {value!r} for --{name}: expected true or false")
    if kind == "int":
        try:
            number = int(value)
        except ValueError:
            raise FlagError(f"invalid value {value!r} for --{name}: expected an integer") from None
        limit = _INT_LIMITS.get(name, 2**31)
        if not -limit <= number < limit:
            raise FlagError(f"value {number} for --{name} is out of range")
        return number
    return value


def _validate(options: Options) -> None:
    if options.rest_api_port != 0:
        raise FlagError(
            f"--rest_api_port={options.rest_api_port}: the REST API is not supported by the "
            "local server; leave --rest_api_port at 0 and use the gRPC API on --port"
        )
    if options.model_base_path and options.model_config_file:
        raise FlagError(
            "--model_base_path and --model_config_file are both set; the local server needs "
            "exactly one (tensorflow_model_server would silently ignore --model_base_path)"
        )
    if options.port < 0 or options.port > 65535:
        raise FlagError(f"--port={options.port} is not a TCP port number")
    if options.grpc_max_threads < 1:
        raise FlagError(f"--grpc_max_threads={options.grpc_max_threads} must be at least 1")
    parse_channel_arguments(options.grpc_channel_arguments)

"""The command line and environment of the gateway: one flag and one GATEWAY_* variable per
setting (gateway.config), shown in `--help` by group.

Every flag `--some-name` has the environment variable `GATEWAY_SOME_NAME`; a flag given on
the command line wins over the variable, and the variable over the default. Besides the
settings, each request default a served task declares (Task.request_defaults: --min-score,
--max-detections) is a flag of the "models" group; its value lands in
Settings.request_defaults.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from gateway.api.arguments import option_flag
from gateway.api.task import TaskRegistry
from gateway.config import Settings
from gateway.models.limits import RequestDefault
from gateway.tasks.builtin import built_in_tasks

# Each setting's group in `--help` (title, settings), in the order Settings declares them.
GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "server": (
        "where and how the gateway serves",
        (
            "host",
            "port",
            "http_port",
            "workers",
            "decode_threads",
            "map_threads",
            "metrics_port",
            "health_interval",
            "shutdown_grace",
            "log_level",
        ),
    ),
    "limits": (
        "what one request, body or stream may take",
        (
            "max_image_bytes",
            "max_pixels",
            "max_receive_message_bytes",
            "max_detections_limit",
            "max_mask_pixels",
            "max_answer_bytes",
            "max_concurrent_work",
            "max_concurrent_requests",
            "stream_window",
            "http_header_timeout",
            "http_body_timeout",
            "http_max_metadata_bytes",
            "http_max_metadata_keys",
        ),
    ),
    "upstream": (
        "the TF Serving hop",
        (
            "upstream",
            "upstream_lb",
            "upstream_timeout",
            "upstream_max_send_bytes",
            "upstream_max_receive_bytes",
            "upstream_max_attempts",
            "upstream_retry_backoff",
            "upstream_retry_budget",
            "upstream_tls",
            "upstream_ca_file",
            "upstream_cert_file",
            "upstream_key_file",
            "upstream_server_name",
        ),
    ),
    "models": (
        "models and request defaults",
        (
            "model",
            "model_config",
            "label_maps",
        ),
    ),
    "jobs": (
        "batch jobs over the API (gateway/jobs)",
        (
            "batch_executor",
            "job_store",
            "batch_allowed_uris",
            "batch_allowed_input_uris",
            "batch_admins",
            "batch_runner_identities",
            "batch_allow_anonymous",
            "batch_max_jobs",
            "batch_max_jobs_per_caller",
            "batch_max_finished_per_caller",
            "batch_max_upload_bytes",
            "batch_max_upload_bytes_per_caller",
            "batch_max_uploads_per_caller",
            "batch_max_upload_images",
            "batch_upload_timeout",
            "batch_max_input_files",
            "batch_max_items_per_job",
            "batch_max_decompressed_bytes",
            "job_store_max_bytes",
            "upload_ttl",
            "operation_ttl",
            "job_lease_seconds",
            "batch_max_running",
            "batch_concurrency",
            "batch_yield_threshold",
            "batch_runner_memory_bytes",
            "batch_runner_max_deaths",
            "batch_checkpoint_seconds",
            "batch_namespace",
            "batch_kubeconfig",
            "batch_image",
            "batch_runner_target",
            "batch_parallelism",
            "batch_cpu",
            "batch_memory",
        ),
    ),
    "security": (
        "TLS, caller identity and gRPC connection limits (docs/security.md)",
        (
            "tls_cert_file",
            "tls_key_file",
            "tls_client_ca_file",
            "trust_xfcc",
            "grpc_max_concurrent_streams",
            "grpc_min_ping_interval",
            "grpc_max_connection_age",
            "grpc_max_connection_age_grace",
            "grpc_max_metadata_bytes",
        ),
    ),
    "policy": (
        "who may do how much, and what is logged (gateway/policy, gateway/paylog)",
        (
            "quotas",
            "max_callers",
            "operator_identities",
            "rollout_salt",
            "payload_log",
            "payload_log_config",
            "payload_log_queue_bytes",
            "payload_log_rotate_bytes",
            "payload_log_timeout",
        ),
    ),
}


def env_name(field_name: str) -> str:
    return "GATEWAY_" + field_name.upper()


def _parse_label_maps(text: str) -> dict[str, Path]:
    maps: dict[str, Path] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, sep, path = part.partition("=")
        if not sep or not name or not path:
            raise argparse.ArgumentTypeError(
                f"label map {part!r} must be MODEL=PATH (several separated by commas)"
            )
        maps[name] = Path(path)
    return maps


_HELP = {
    "host": "address to listen on",
    "port": "gRPC port",
    "http_port": "HTTP port (REST routes, /invocations, /ping, web page); 0 disables",
    "http_header_timeout": "seconds for a request's headers (and idle keep-alive)",
    "http_body_timeout": "seconds for a request's body to arrive; then 408",
    "http_max_metadata_bytes": "bytes an HTTP request may carry besides its image (metadata)",
    "http_max_metadata_keys": "metadata keys a MessagePack body may carry",
    "upstream": "TF Serving gRPC target (host:port or dns:///service:port)",
    "upstream_lb": "client-side load balancing over the target's addresses",
    "model": "model used when a request names none",
    "model_config": "TOML file with per-model task, labels, input preparation and defaults",
    "label_maps": "MODEL=PATH[,MODEL=PATH...] OD API label_map.pbtxt per model",
    "upstream_timeout": "seconds a TF Serving call may take",
    "max_image_bytes": "largest encoded image accepted",
    "max_pixels": "largest image accepted, in pixels (width x height)",
    "max_receive_message_bytes": "gateway server receive limit (0: max-image-bytes + 1 MiB)",
    "upstream_max_send_bytes": "limit on requests to TF Serving (0: 3 x max-pixels + 1 MiB)",
    "upstream_max_receive_bytes": "limit on responses from TF Serving",
    "max_concurrent_requests": "requests worked on at once; more get RESOURCE_EXHAUSTED",
    "stream_window": "frames of one DetectStream in flight",
    "decode_threads": "image decoding threads",
    "map_threads": "threads for heavy mapping (segmentation masks), apart from decoding",
    "max_detections_limit": "most detections a request may ask for (models.NAME.limits)",
    "max_mask_pixels": "mask pixels one segmentation answer may paste; more are left out",
    "max_answer_bytes": "mask bytes one answer may hold; more instances are left out",
    "max_concurrent_work": "work units in flight (megapixels, answer MB), shared fairly",
    "metrics_port": "Prometheus metrics port (0 disables)",
    "health_interval": "seconds between TF Serving model status checks",
    "shutdown_grace": "seconds in-flight requests get after SIGTERM",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "grpc_max_concurrent_streams": "gRPC calls open at once on one connection",
    "grpc_min_ping_interval": "seconds a gRPC client must leave between keepalive pings",
    "grpc_max_connection_age": "seconds before a gRPC connection is asked to reconnect (0: never)",
    "grpc_max_connection_age_grace": "seconds calls on such a connection get before it closes",
    "grpc_max_metadata_bytes": "largest metadata (headers) of one gRPC call, in bytes",
    "upstream_max_attempts": "attempts per TF Serving call, retries included (1: no retries)",
    "upstream_retry_backoff": "seconds before the first retry (doubles, jittered, max 1 s)",
    "upstream_retry_budget": "retries allowed per call made, after a reserve of 10",
    "upstream_tls": "TLS to TF Serving (true/false; implied by a CA or client certificate)",
    "upstream_ca_file": "PEM CA bundle for TF Serving's certificate (default: system roots)",
    "upstream_cert_file": "PEM client certificate chain for mTLS to TF Serving",
    "upstream_key_file": "PEM private key of the client certificate",
    "upstream_server_name": "name expected in TF Serving's certificate (default: target host)",
    "tls_cert_file": "PEM certificate chain for TLS on the gateway's port",
    "tls_key_file": "PEM private key for tls-cert-file",
    "tls_client_ca_file": "PEM CA bundle; when set, clients must present a certificate (mTLS)",
    "workers": "gateway processes sharing the port (SO_REUSEPORT); 1 serves in this process",
    "batch_executor": "where batch jobs run: local (in this process) or kubernetes (Jobs)",
    "job_store": "batch job records, uploads and default outputs (directory or fsspec URI)",
    "batch_allowed_uris": "comma-separated output prefixes callers may name (job store always)",
    "batch_allowed_input_uris": "comma-separated input prefixes API jobs may read (uploads always)",
    "trust_xfcc": "take the caller from x-forwarded-client-cert (only behind a proxy that sets it)",
    "batch_admins": "comma-separated typed identities (uri:..., cn:...) managing every operation",
    "batch_runner_identities": "typed identities of runner pods, which may name a job's owner",
    "batch_allow_anonymous": "callers without an identity may use jobs (all as one shared tenant)",
    "batch_max_jobs": "unfinished batch jobs at once, all callers",
    "batch_max_jobs_per_caller": "unfinished batch jobs at once per caller",
    "batch_max_finished_per_caller": "finished operations one caller keeps (more: creates refused)",
    "batch_max_upload_bytes": "largest UploadImages upload, in bytes",
    "batch_max_upload_bytes_per_caller": "bytes of all uploads one caller keeps in the store",
    "batch_max_uploads_per_caller": "uploads one caller keeps that no job uses yet",
    "batch_max_upload_images": "images in one upload (all its UploadImages calls together)",
    "batch_upload_timeout": "seconds one upload call may take in all (trickling ones end here)",
    "batch_max_input_files": "files one job's input may list",
    "batch_max_items_per_job": "manifest lines and TFRecord records one job reads",
    "batch_max_decompressed_bytes": "bytes one manifest or TFRecord file may hold uncompressed",
    "job_store_max_bytes": "bytes the gateway may keep in its job store (uploads, results)",
    "upload_ttl": "seconds an upload no job uses is kept after its last image",
    "operation_ttl": "seconds a finished operation and its stored results are kept",
    "job_lease_seconds": "seconds after its last renewal that another replica takes a job over",
    "batch_max_running": "local executor: batch jobs running at once (others wait, QUEUED)",
    "batch_concurrency": "local executor: batch images in flight over all running jobs",
    "batch_yield_threshold": "local executor: online images in flight that pause batch images",
    "batch_runner_memory_bytes": "local executor: address space of each job's runner process",
    "batch_runner_max_deaths": "local executor: runner deaths after which a job fails (poison)",
    "batch_checkpoint_seconds": "seconds between batch checkpoints (redone after a crash)",
    "batch_namespace": "kubernetes executor: namespace for Jobs (default: the pod's own)",
    "batch_kubeconfig": "kubernetes executor: kubeconfig file (default: in-cluster config)",
    "batch_image": "kubernetes executor: image of the runner pods (default: the gateway pod's own)",
    "batch_runner_target": "kubernetes executor: gateway host:port the runner pods call",
    "batch_parallelism": "kubernetes executor: shards (pods) running at once per job",
    "batch_cpu": "kubernetes executor: runner pod CPU request,limit",
    "batch_memory": "kubernetes executor: runner pod memory request,limit",
    "quotas": "TOML quota file: rate, burst, concurrency per caller (reloaded on change)",
    "max_callers": "callers the fair share keeps state for; past it new ones share an entry",
    "operator_identities": "comma-separated typed identities that may read rollout statistics",
    "rollout_salt": "secret salting sticky canary assignment (the same on every replica)",
    "payload_log": "payload log sink: a file path, an fsspec URL or http(s):// (empty: off)",
    "payload_log_config": "TOML payload log sampling per caller: rate, images (reloaded)",
    "payload_log_queue_bytes": "bytes payload log records may hold queued; more are dropped",
    "payload_log_rotate_bytes": "payload log file rotated, object written, at this size",
    "payload_log_timeout": "seconds one POST to an HTTP payload log sink may take",
}


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _converter(name: str, default: Any) -> Callable[[str], Any]:
    if name == "label_maps":
        return _parse_label_maps
    if isinstance(default, bool):
        return _parse_bool
    return type(default)


# Settings fields that are no flag of their own.
NOT_FLAGS = ("request_defaults",)


def request_defaults(tasks: TaskRegistry | None = None) -> tuple[RequestDefault, ...]:
    """The request defaults the tasks declare (the built-in tasks when None), each once:
    tasks may share one (detection's --min-score is keypoints' and segmentation's), but not
    declare one name twice differently."""
    if tasks is None:
        tasks = built_in_tasks()
    found: dict[str, RequestDefault] = {}
    settings = {setting.name for setting in fields(Settings)}
    for name, task in tasks.items():
        for declared in task.request_defaults:
            if declared.name in settings:
                raise ValueError(
                    f"task {name!r} declares the request default {declared.name!r}, which is "
                    "a setting of the gateway: name it otherwise"
                )
            seen = found.setdefault(declared.name, declared)
            if seen != declared:
                raise ValueError(
                    f"task {name!r} declares the request default {declared.name!r} unlike "
                    f"another task: {declared} and {seen}"
                )
    return tuple(found.values())


def flag_names(tasks: TaskRegistry | None = None) -> tuple[str, ...]:
    """Every flag's name ("min_score"; its variable is env_name's): the settings', then the
    request defaults `tasks` declare (the built-in tasks' when None)."""
    settings = tuple(s.name for s in fields(Settings) if s.name not in NOT_FLAGS)
    return settings + tuple(d.name for d in request_defaults(tasks))


def parse_settings(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    tasks: TaskRegistry | None = None,
) -> Settings:
    """Settings from flags, then GATEWAY_* variables, then defaults; the request defaults
    `tasks` declare (the built-in tasks' when None) among them. Exits on bad input."""
    environ = os.environ if environ is None else environ
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description="Vision gateway: typed gRPC and HTTP APIs (detection, classification) in "
        "front of TensorFlow Serving. Each flag can also be set with the environment variable "
        "shown.",
    )
    sections = {
        group: parser.add_argument_group(f"{group}: {title}")
        for group, (title, _) in GROUPS.items()
    }
    group_of = {name: group for group, (_, names) in GROUPS.items() for name in names}

    def add(name: str, default: Any, convert: Callable[[str], Any], shown: Any, text: str,
            group: str) -> None:  # fmt: skip
        env = env_name(name)
        value = default
        if env in environ:
            try:
                value = convert(environ[env])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{env}={environ[env]!r}: {exc}")
        sections[group].add_argument(
            option_flag(name),
            dest=name,
            type=convert,
            default=value,
            help=f"{text} [{env}; default {shown}]",
        )

    for setting in fields(Settings):
        if setting.name in NOT_FLAGS:
            continue
        default = getattr(defaults, setting.name)
        shown = (
            ",".join(f"{name}={path}" for name, path in default.items())
            if setting.name == "label_maps"
            else default
        )
        convert = _converter(setting.name, default)
        add(setting.name, default, convert, shown, _HELP[setting.name], group_of[setting.name])
    try:
        declared = request_defaults(tasks)
    except ValueError as exc:
        parser.error(str(exc))
    for task_default in declared:
        default = task_default.default
        add(task_default.name, default, type(default), default, task_default.help, "models")
    args = vars(parser.parse_args(argv))
    chosen = {d.name: args.pop(d.name) for d in declared}
    settings = Settings(**args, request_defaults=chosen)
    try:
        settings.validate()
        for task_default in declared:
            task_default.check(chosen[task_default.name])
    except ValueError as exc:
        parser.error(str(exc))
    return settings

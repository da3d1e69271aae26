"""serving.local's command line and config files: TF Serving's flags, defaults and errors.

Flag parsing and config validation run in-process; the exit codes and printed errors of
the real process are checked with `run_to_exit` (these fail before TensorFlow loads).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.local import config, flags
from serving.local.errors import ServingError
from serving.local.flags import FlagError, Options, parse_flags
from tests.support.facts import text
from tests.support.localserver import run_to_exit

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_flags_take_both_value_forms_and_bare_booleans():
    options = parse_flags(
        [
            "--port",
            "9000",
            "--model_name=detector",
            "--model_base_path",
            "/models/detector",
            "--enable_batching",
            "--enable_model_warmup=false",
            "--allow_version_labels_for_unavailable_models=true",
            "--load_retry_interval_micros=5000000000",
        ]
    )
    assert options.port == 9000
    assert options.model_name == "detector"
    assert options.model_base_path == "/models/detector"
    assert options.enable_batching is True
    assert options.enable_model_warmup is False
    assert options.allow_version_labels_for_unavailable_models is True
    assert options.load_retry_interval_micros == 5_000_000_000


def test_defaults_are_tf_servings():
    options = parse_flags(["--model_base_path=/m"])
    assert options.port == 8500
    assert options.model_name == "default"
    assert options.file_system_poll_wait_seconds == 1
    assert options.model_config_file_poll_wait_seconds == 0
    assert options.enable_model_warmup is True
    assert options.saved_model_tags == "serve"
    assert options.max_num_load_retries == 5
    assert options.load_retry_interval_micros == 60_000_000
    assert options.enable_serialization_as_tensor_content is False
    assert options.grpc_max_threads >= 4 and options.grpc_max_threads % 4 == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grpc_socket_path=/tmp/s"], "--grpc_socket_path is a tensorflow_model_server flag"),
        (["--ssl_config_file", "x"], "not supported by the local server"),
        (["--enable_profiler=false"], "--enable_profiler is a tensorflow_model_server flag"),
        (["--no_such_flag=1"], "unknown flag --no_such_flag"),
        (["positional"], "unknown argument: positional"),
        (["--port=http"], "invalid value 'http' for --port"),
        (["--enable_batching=maybe"], "expected true or false"),
        (["--port"], "--port needs a value"),
        (["--rest_api_port=8501"], "REST API is not supported by the local server"),
        (["--model_base_path=/a", "--model_config_file=/b"], "exactly one"),
        (["--grpc_channel_arguments=grpc.max_connection_age_ms"], "is not key=value"),
    ],
)
def test_bad_command_lines_are_refused_with_a_reason(argv: list[str], message: str):
    with pytest.raises(FlagError, match=message.replace("(", r"\(")):
        parse_flags(argv)


def test_channel_arguments_are_ints_when_they_fit_int32():
    assert flags.parse_channel_arguments(
        "grpc.max_connection_age_ms=2000,grpc.primary_user_agent=tfs,grpc.big=99999999999"
    ) == [
        ("grpc.max_connection_age_ms", 2000),
        ("grpc.primary_user_agent", "tfs"),
        ("grpc.big", "99999999999"),
    ]


def test_unsupported_flag_exits_2_naming_the_flag():
    result = run_to_exit(["--model_base_path=/m", "--use_alts_credentials"])
    assert result.returncode == 2
    assert "--use_alts_credentials is a tensorflow_model_server flag that is not supported" in (
        result.stdout
    )


def test_missing_model_paths_fail_with_tf_servings_startup_error():
    result = run_to_exit([])
    assert result.returncode == 255
    assert (
        text("startup_failed", code="INVALID_ARGUMENT", message=text("no_model_source"))
        in result.stdout
    )


def test_batching_file_without_enable_batching_fails_like_tf_serving():
    result = run_to_exit(
        ["--model_base_path=/m", "--batching_parameters_file=serving/batching.config"]
    )
    assert result.returncode == 255
    assert (
        "Failed to start server. Error: INVALID_ARGUMENT: server_options.batching_parameters_file"
        " is set without setting server_options.enable_batching to true." in result.stdout
    )


def test_version_flag_prints_versions():
    result = run_to_exit(["--version"])
    assert result.returncode == 0
    assert result.stdout.startswith("TensorFlow ModelServer: ")
    assert "TensorFlow Library: " in result.stdout


def test_repository_config_files_parse():
    options = Options(
        model_config_file=str(REPO_ROOT / "serving/models.config"),
        enable_batching=True,
        batching_parameters_file=str(REPO_ROOT / "serving/batching.config"),
        monitoring_config_file=str(REPO_ROOT / "serving/monitoring.config"),
    )
    startup = config.read_startup_config(options)
    assert [m.name for m in startup.models] == [
        "detector",
        "detector_encoded",
        "detector_fixed",
        "detector_float",
        "classifier",
        "classifier_scores",
        "classifier_logits",
        "maskrcnn",
        "pose",
        "embedder",
    ]
    assert all(Path(m.base_path).is_absolute() for m in startup.models)
    assert startup.batching is not None
    config.check_allowed_batch_sizes(startup.batching)


def test_allowed_batch_sizes_must_end_at_max_batch_size(tmp_path: Path):
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 4 } allowed_batch_sizes: 1 allowed_batch_sizes: 3")
    params = config.read_batching_parameters(
        Options(enable_batching=True, batching_parameters_file=str(path))
    )
    assert params is not None
    with pytest.raises(ServingError) as info:
        config.check_allowed_batch_sizes(params)
    assert str(info.value) == (
        "INVALID_ARGUMENT: Last entry in allowed_batch_sizes must match max_batch_size; "
        "last entry was 3; expected 4"
    )


def test_unparsable_config_files_give_tf_servings_error(tmp_path: Path):
    path = tmp_path / "monitoring.config"
    path.write_text("prometheus_config { enable: yes please }")
    with pytest.raises(ServingError) as info:
        config.read_monitoring_config(Options(monitoring_config_file=str(path)))
    assert str(info.value) == f"INVALID_ARGUMENT: Invalid protobuf file: '{path}'"


def test_model_config_list_rules(tmp_path: Path):
    path = tmp_path / "models.config"
    path.write_text(
        "model_config_list { config { name: 'm' base_path: '/a' model_platform: 'tensorflow' }"
        " config { name: 'm' base_path: '/b' model_platform: 'tensorflow' } }"
    )
    with pytest.raises(ServingError, match="Illegal to list model m multiple times"):
        config.read_model_configs(Options(model_config_file=str(path)))
    path.write_text(
        "model_config_list { config { name: 'm' base_path: '/a' model_platform: 'x' } }"
    )
    with pytest.raises(ServingError, match="Model m requests unsupported platform x"):
        config.read_model_configs(Options(model_config_file=str(path)))

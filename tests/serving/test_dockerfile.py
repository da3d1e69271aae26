"""Dockerfile.serving cannot be built here (no container engine), so it is kept honest by
reading: the flags it passes are real tensorflow_model_server flags (serving/local/tfs_flags.json,
taken from TF Serving's main.cc at the version the image pins), the files they name come from
this repository, and the local server accepts the same flags and files."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.export import MODELS
from serving.local.config import read_startup_config
from serving.local.flags import UNSUPPORTED_FLAGS, Options, parse_flags

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile.serving").read_text()
# Where the final stage's files come from: COPY <repo paths...> <dir>/ lines.
_COPY = re.compile(r"^COPY (?!--from)(.+?) (/\S+/)$", re.MULTILINE)


def entrypoint() -> list[str]:
    match = re.search(r"^ENTRYPOINT (\[.*?\])", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert match, "Dockerfile.serving has no exec-form ENTRYPOINT"
    return list(json.loads(match.group(1).replace("\\\n", "")))


def flags() -> dict[str, str]:
    pairs = (arg[2:].split("=", 1) for arg in entrypoint()[1:])
    return {name: value for name, value in pairs}


def copied_files() -> dict[str, Path]:
    """Container path -> repository file, for the final stage's COPY lines."""
    final_stage = DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]
    result = {}
    for sources, target in _COPY.findall(final_stage):
        for source in sources.split():
            result[target + Path(source).name] = ROOT / source
    return result


def rewritten_models_config() -> str:
    """serving/models.config as the models stage rewrites it for /models."""
    sed = re.search(r'sed -e "s#(.+?)#(.+?)#"', DOCKERFILE)
    assert sed, "the models stage no longer rewrites base paths with sed"
    text = (ROOT / "serving" / "models.config").read_text()
    return text.replace(sed.group(1), sed.group(2))


def test_it_runs_the_real_model_server_at_a_pinned_version_as_non_root() -> None:
    assert entrypoint()[0] == "tensorflow_model_server"
    image = re.search(r"^ARG TF_SERVING_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert image and re.fullmatch(r"tensorflow/serving:\d+\.\d+\.\d+", image.group(1))
    user = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert user and user[-1].isdigit() and int(user[-1]) != 0


TFS_FLAGS = json.loads((ROOT / "serving" / "local" / "tfs_flags.json").read_text())


def image_version() -> str:
    image = re.search(r"^ARG TF_SERVING_IMAGE=tensorflow/serving:(\S+)$", DOCKERFILE, re.MULTILINE)
    assert image, "Dockerfile.serving has no ARG TF_SERVING_IMAGE=tensorflow/serving:<version>"
    return image.group(1)


def test_the_flag_list_is_for_the_pinned_image_version() -> None:
    """Bumping the image means refreshing tfs_flags.json from that version's main.cc."""
    assert TFS_FLAGS["version"] == image_version()
    assert re.fullmatch(r"[0-9a-f]{40}", TFS_FLAGS["commit"])
    assert "main.cc" in TFS_FLAGS["about"] and "server.h" in TFS_FLAGS["about"]
    # Flags this project relies on are in the list.
    for name in ("port", "rest_api_port", "model_config_file", "enable_batching", "version"):
        assert name in TFS_FLAGS["flags"], name


def _valid_value(kind: str, value: str) -> bool:
    """Whether TF Serving's flag parser takes `value` for a flag of C++ type `kind`."""
    if kind == "bool":
        return value in ("true", "false", "1", "0")
    if kind in ("int32", "int64"):
        bits = 31 if kind == "int32" else 63
        return re.fullmatch(r"-?[0-9]+", value) is not None and -(2**bits) <= int(value) < 2**bits
    if kind == "float":
        return re.fullmatch(r"-?[0-9]*\.?[0-9]+", value) is not None
    return kind == "string"


def test_every_flag_is_a_tensorflow_model_server_flag() -> None:
    real = TFS_FLAGS["flags"]
    assert set(flags()) <= set(real), set(flags()) - set(real)
    for name, value in flags().items():
        assert _valid_value(real[name], value), f"--{name}={value} is not a {real[name]}"


def test_the_local_server_knows_every_real_flag_and_no_other() -> None:
    """Each tensorflow_model_server flag is implemented or refused by name, never unknown."""
    implemented = {f.name for f in fields(Options)}
    assert implemented.isdisjoint(UNSUPPORTED_FLAGS)
    assert implemented | set(UNSUPPORTED_FLAGS) == set(TFS_FLAGS["flags"])


def test_the_issue_required_flags_are_set() -> None:
    given = flags()
    for name in (
        "model_config_file",
        "enable_batching",
        "batching_parameters_file",
        "monitoring_config_file",
        "rest_api_port",
        "enable_model_warmup",
    ):
        assert name in given, name
    assert given["enable_batching"] == "true" and given["enable_model_warmup"] == "true"
    assert given["rest_api_port"] != "0"  # Prometheus metrics are served on the REST port


def test_config_files_named_by_flags_come_from_the_repository() -> None:
    copied = copied_files()
    for name in ("batching_parameters_file", "monitoring_config_file"):
        path = flags()[name]
        assert path in copied, f"--{name}={path} is not copied into the image"
        assert copied[path].is_file()
    assert flags()["model_config_file"] == "/models/models.config"
    assert "/models/models.config" in DOCKERFILE.split("FROM ${TF_SERVING_IMAGE}")[0]


def test_the_rewritten_model_config_points_at_the_image_models() -> None:
    config = text_format.Parse(
        rewritten_models_config(), model_server_config_pb2.ModelServerConfig()
    )
    models = config.model_config_list.config
    assert {m.name for m in models} == set(MODELS)
    for model in models:
        assert model.base_path == f"/models/{model.name}"
        assert model.model_platform == "tensorflow"
        assert set(model.version_labels) == {"stable", "canary"}


def test_the_local_server_accepts_the_same_flags_and_files(tmp_path: Path) -> None:
    """The stand-in runs the same startup checks on the same files (REST aside)."""
    copied = copied_files()
    config = tmp_path / "models.config"
    config.write_text(rewritten_models_config())
    argv = []
    for name, value in flags().items():
        if name == "rest_api_port":
            value = "0"  # the local server has no REST API
        elif value in copied:
            value = str(copied[value])
        elif name == "model_config_file":
            value = str(config)
        argv.append(f"--{name}={value}")
    options = parse_flags(argv)
    startup = read_startup_config(options)
    assert {m.name for m in startup.models} == set(MODELS)
    batching = startup.batching
    assert batching is not None
    # Detection images vary in size: without padding, TF Serving fails mixed batches.
    assert batching.pad_variable_length_inputs  # type: ignore[attr-defined]


def test_the_gateway_image_ships_the_reference_model_config_and_its_labels() -> None:
    gateway_dockerfile = (ROOT / "Dockerfile.gateway").read_text()
    assert "ENV GATEWAY_MODEL_CONFIG=/etc/detection-gateway/gateway-models.toml" in (
        gateway_dockerfile
    )
    copy = (
        "COPY serving/gateway-models.toml serving/label_map.pbtxt serving/labels.txt "
        "serving/pose-labels.txt /etc/detection-gateway/"
    )
    assert copy in gateway_dockerfile

"""serving.local's model lifecycle: version policies, labels, polling, warmup and startup.

Each test that changes the model repository or config gets its own server on a copy of
the reference models, so the tests stay independent.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
)

from serving import scenes
from serving.export import export_models
from tests.support.facts import fact, text
from tests.support.localserver import LocalServer, free_port, run_local_server, run_to_exit

AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
END = get_model_status_pb2.ModelVersionStatus.END
WARMUP = Path("assets.extra/tf_serving_warmup_requests")


@pytest.fixture(scope="module")
def two_versions(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with `detector` versions 1 and 2 (read-only: tests copy it)."""
    root = tmp_path_factory.mktemp("two-versions")
    shutil.copytree(model_repo / "detector", root / "detector")
    export_models(root, version=2, names=("detector",))
    return root


def copy_model(source: Path, target: Path, versions: tuple[int, ...]) -> Path:
    """Copies the chosen version directories of one model; returns the new base path."""
    target.mkdir(parents=True)
    for version in versions:
        shutil.copytree(source / str(version), target / str(version))
    return target


def add_version(base: Path, source: Path, version: int) -> None:
    """Adds a version the way an exporter should: copy under a non-numeric name, rename."""
    staging = base / f".staging-{version}"
    shutil.copytree(source, staging)
    staging.rename(base / str(version))


def model_config(*models: str) -> str:
    return "model_config_list {\n" + "".join(f"  config {{ {m} }}\n" for m in models) + "}\n"


def detector_config(base: Path, extra: str = "") -> str:
    return f"name: 'detector' base_path: '{base}' model_platform: 'tensorflow' {extra}"


class Client:
    """The official stubs on one channel, with the few calls these tests need."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(channel)

    def predict(self, model: str = "detector", **spec: object) -> predict_pb2.PredictResponse:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        if "version" in spec:
            request.model_spec.version.value = int(spec["version"])
        if "version_label" in spec:
            request.model_spec.version_label = str(spec["version_label"])
        pixels = spec.get("pixels", np.zeros([1, 32, 32, 3], np.uint8))
        value = pixels if model == "detector" else np.array([scenes.encode(pixels[0])], object)
        request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto(value))
        return self.prediction.Predict(request, timeout=60)

    def served_version(self, model: str = "detector", **spec: object) -> int:
        return int(self.predict(model, **spec).model_spec.version.value)

    def states(self, model: str = "detector") -> dict[int, int]:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        response = self.models.GetModelStatus(request, timeout=10)
        return {s.version: s.state for s in response.model_version_status}

    def error(self, model: str = "detector", **spec: object) -> tuple[str, str]:
        with pytest.raises(grpc.RpcError) as info:
            self.predict(model, **spec)
        return info.value.code().name, info.value.details()


@pytest.fixture
def client_of() -> Iterator[Callable[[LocalServer], Client]]:
    channels: list[grpc.Channel] = []

    def connect(server: LocalServer) -> Client:
        channels.append(server.channel())
        return Client(channels[-1])

    yield connect
    for channel in channels:
        channel.close()


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Polls `condition` (an RPC error counts as "not yet") until it holds."""
    deadline = time.monotonic() + timeout
    while not _holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except grpc.RpcError:
        return False


# ----- versions and labels (one server, read-only) ------------------------------------------


@pytest.fixture(scope="module")
def labelled(two_versions: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """`all` policy over versions 1 and 2, labels on both, outputs as tensor_content."""
    directory = tmp_path_factory.mktemp("labelled")
    config = directory / "models.config"
    labels = "version_labels { key: 'stable' value: 1 } version_labels { key: 'canary' value: 2 }"
    config.write_text(
        model_config(
            detector_config(
                two_versions / "detector", f"model_version_policy {{ all {{}} }} {labels}"
            )
        )
    )
    args = [
        f"--model_config_file={config}",
        "--allow_version_labels_for_unavailable_models",
        "--enable_serialization_as_tensor_content",
    ]
    with run_local_server(args, log_dir=directory) as server:
        yield server


def test_version_and_label_select_the_served_version(labelled, client_of):
    client = client_of(labelled)
    assert client.states() == {2: AVAILABLE, 1: AVAILABLE}
    assert list(client.states()) == [2, 1]  # newest first
    assert client.served_version() == 2
    assert client.served_version(version=1) == 1
    assert client.served_version(version_label="stable") == 1
    assert client.served_version(version_label="canary") == 2
    assert client.error(version=3) == fact(
        "servable_not_found_specific", model="detector", version=3
    )


def test_outputs_are_tensor_content_with_the_flag(labelled, client_of):
    painted = scenes.generate_scene(np.random.default_rng(21), 320, 240, 3)
    response = client_of(labelled).predict(pixels=painted.pixels[np.newaxis])
    boxes = response.outputs["detection_boxes"]
    assert boxes.float_val == [] and len(boxes.tensor_content) == 1 * 100 * 4 * 4
    assert tf.make_ndarray(response.outputs["num_detections"]).tolist() == [len(painted.boxes)]


def test_each_load_and_warmup_is_logged(labelled, two_versions):
    log = labelled.log_text()
    for version in (1, 2):
        assert f"Successfully loaded servable version {{name: detector version: {version}}}" in log
        warmup = two_versions / "detector" / str(version) / WARMUP
        finished = text("warmup_finished", path=warmup, count=3, micros="")
        assert finished[: finished.index("Elapsed")] in log
    assert "Running gRPC ModelServer at 127.0.0.1:" in log


# ----- polling the base path --------------------------------------------------------------------


def test_new_version_is_served_and_old_ones_unloaded_without_restart(
    two_versions, tmp_path, client_of
):
    base = copy_model(two_versions / "detector", tmp_path / "detector", (1,))
    args = [
        "--model_name=detector",
        f"--model_base_path={base}",
        "--file_system_poll_wait_seconds=1",
        "--enable_batching",
        "--batching_parameters_file=serving/batching.config",
        # Accepted and applied (gRPC server arguments, thread counts); no visible effect here.
        "--grpc_channel_arguments=grpc.max_connection_age_ms=600000,grpc.http2.max_pings_without_data=0",
        "--grpc_max_threads=8",
        "--tensorflow_intra_op_parallelism=2",
        "--tensorflow_inter_op_parallelism=2",
    ]
    with run_local_server(args, log_dir=tmp_path) as server:
        client = client_of(server)
        assert client.served_version() == 1

        add_version(base, two_versions / "detector" / "2", 2)
        wait_for(lambda: client.states() == {2: AVAILABLE, 1: END}, what="version 2 to replace 1")
        assert client.served_version() == 2
        assert client.error(version=1) == fact(
            "servable_not_found_specific", model="detector", version=1
        )

        # Version 2 gone: version 1 is the latest again and comes back.
        shutil.rmtree(base / "2")
        wait_for(lambda: client.states() == {2: END, 1: AVAILABLE}, what="version 1 to return")
        assert client.served_version() == 1

        shutil.rmtree(base / "1")
        wait_for(lambda: client.states() == {2: END, 1: END}, what="every version to unload")
        assert client.error() == fact("servable_not_found_latest", model="detector")
        log = server.log_text()
        assert text("no_numeric_versions", model="detector", path=base) in log
        assert "the local server runs every request unbatched" in log
        # Shutdown is clean, and a second signal in the middle of it does not hang it.
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        assert server.log_text().rstrip().endswith("Server stopped")


def test_startup_waits_until_a_version_directory_appears(two_versions, tmp_path):
    base = tmp_path / "detector"
    (base / "not-a-version").mkdir(parents=True)
    args = [
        "--model_name=detector",
        f"--model_base_path={base}",
        "--file_system_poll_wait_seconds=1",
    ]
    port = free_port()
    server = LocalServer([*args, f"--port={port}"], port, tmp_path / "server.log")

    def add_when_polled() -> None:
        wait_for(lambda: "No versions of servable detector" in server.log_text(), what="a poll")
        add_version(base, two_versions / "detector" / "1", 1)

    helper = threading.Thread(target=add_when_polled)
    helper.start()
    try:
        server.start(timeout=120)  # returns only once the port is open
        helper.join()
        log = server.log_text()
        no_versions = text("no_numeric_versions", model="detector", path=base)
        assert log.index(no_versions) < log.index("Running gRPC ModelServer")
    finally:
        helper.join()
        server.stop()


# ----- config reload ------------------------------------------------------------------------------


def test_config_file_changes_are_applied_while_serving(
    two_versions, model_repo, tmp_path, client_of
):
    config = tmp_path / "models.config"
    base = two_versions / "detector"
    config.write_text(
        model_config(
            detector_config(
                base,
                "model_version_policy { all {} } version_labels { key: 'stable' value: 1 }",
            )
        )
    )
    args = [
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
        "--enable_model_warmup=false",
    ]
    with run_local_server(args, log_dir=tmp_path) as server:
        client = client_of(server)
        assert client.served_version(version_label="stable") == 1

        encoded = (
            f"name: 'detector_encoded' base_path: '{model_repo / 'detector_encoded'}' "
            "model_platform: 'tensorflow'"
        )
        moved = "model_version_policy { all {} } version_labels { key: 'stable' value: 2 }"
        config.write_text(model_config(detector_config(base, moved), encoded))
        wait_for(
            lambda: client.states("detector_encoded") == {1: AVAILABLE},
            what="detector_encoded to load",
        )
        wait_for(lambda: client.served_version(version_label="stable") == 2, what="the label")
        assert client.served_version("detector_encoded") == 1

        # An existing label may only move to a loaded version, even with the flag.
        config.write_text(
            model_config(
                detector_config(
                    base,
                    "model_version_policy { all {} } version_labels { key: 'stable' value: 7 }",
                ),
                encoded,
            )
        )
        wait_for(
            lambda: (
                "PollFilesystemAndReloadConfig failed to ReloadConfig: Request to assign "
                "label to version 7 of model detector, which is not currently available for "
                "inference" in server.log_text()
            ),
            what="the refused reload",
        )
        assert client.served_version(version_label="stable") == 2

        config.write_text(model_config(detector_config(base, moved)))
        wait_for(lambda: client.states("detector_encoded") == {1: END}, what="the removal")
        assert client.error("detector_encoded") == fact(
            "servable_not_found_latest", model="detector_encoded"
        )
        assert "warmup data" not in server.log_text()


# ----- startup failures ------------------------------------------------------------------------


def test_labels_at_startup_need_the_allow_flag(two_versions, tmp_path):
    config = tmp_path / "models.config"
    config.write_text(
        model_config(
            detector_config(two_versions / "detector", "version_labels { key: 'stable' value: 1 }")
        )
    )
    result = run_to_exit([f"--model_config_file={config}", f"--port={free_port()}"])
    assert result.returncode == 255
    code, message = fact("label_on_unavailable_version", version=1, model="detector")
    assert text("startup_failed", code=code, message=message) in result.stdout


def write_records(path: Path, records: list[prediction_log_pb2.PredictionLog]) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record.SerializeToString())


def test_warmup_errors_fail_the_load_and_startup(model_repo, tmp_path):
    bad_request = predict_pb2.PredictRequest()
    bad_request.model_spec.name = "detector"
    bad_request.inputs["input_tensor"].CopyFrom(
        tf.make_tensor_proto(np.zeros([1, 8, 8, 3], np.float32))
    )
    bad_dtype = copy_model(model_repo / "detector", tmp_path / "bad_dtype", (1,))
    write_records(
        bad_dtype / "1" / WARMUP,
        [prediction_log_pb2.PredictionLog(predict_log={"request": bad_request})],
    )
    too_many = copy_model(model_repo / "detector", tmp_path / "too_many", (1,))
    write_records(too_many / "1" / WARMUP, [prediction_log_pb2.PredictionLog()] * 1001)
    config = tmp_path / "models.config"
    config.write_text(
        model_config(
            f"name: 'bad_dtype' base_path: '{bad_dtype}' model_platform: 'tensorflow'",
            f"name: 'too_many' base_path: '{too_many}' model_platform: 'tensorflow'",
        )
    )
    args = [f"--model_config_file={config}", "--max_num_load_retries=0", f"--port={free_port()}"]
    result = run_to_exit(args, timeout=120)
    assert result.returncode == 255
    assert (
        "Failed to start server. Error: UNKNOWN: 2 model(s) did not become available: "
        "{{{name: bad_dtype version: 1} due to error: INVALID_ARGUMENT: Expects arg[0] to be "
        "uint8 but float is provided}, {{name: too_many version: 1} due to error: "
        "INVALID_ARGUMENT: Number of warmup records exceeds the maximum (1000) at "
        f"{too_many / '1' / WARMUP}}}, }}" in result.stdout
    )


def test_allowed_batch_sizes_mismatch_fails_each_load(model_repo, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 4 } allowed_batch_sizes: 1 allowed_batch_sizes: 2")
    args = [
        "--model_name=detector",
        f"--model_base_path={model_repo / 'detector'}",
        "--enable_batching=true",
        f"--batching_parameters_file={batching}",
        "--max_num_load_retries=1",
        "--load_retry_interval_micros=0",
        f"--port={free_port()}",
    ]
    result = run_to_exit(args)
    assert result.returncode == 255
    assert (
        "Failed to start server. Error: UNKNOWN: 1 model(s) did not become available: "
        "{{{name: detector version: 1} due to error: INVALID_ARGUMENT: Last entry in "
        "allowed_batch_sizes must match max_batch_size; last entry was 2; expected 4}, }"
        in result.stdout
    )
    assert "Retrying of Loading servable: {name: detector version: 1} retry: 1" in result.stdout

"""serving.local's model config: the config file's changes applied while serving, and the
startups that fail (labels without the flag, warmup errors, batch sizes that do not match).

Each test gets its own server on a copy of the reference models, so the tests stay independent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from tests.support.facts import fact, text
from tests.support.localserver import free_port, run_local_server, run_to_exit
from tests.support.servingcalls import (
    AVAILABLE,
    END,
    WARMUP,
    copy_model,
    detector_config,
    model_config,
    wait_for,
)

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

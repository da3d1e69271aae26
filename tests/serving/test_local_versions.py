"""serving.local's model versions: version policies and labels on one server, and the polling of
the base path as versions come and go (the config file's reloads and the startup failures are
in test_local_config.py).

Each test that changes the model repository gets its own server on a copy of the reference
models (`two_versions`, tests/serving/conftest.py), so the tests stay independent.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from serving import scenes
from tests.support.facts import fact, text
from tests.support.localserver import LocalServer, free_port, run_local_server
from tests.support.servingcalls import (
    AVAILABLE,
    END,
    WARMUP,
    add_version,
    copy_model,
    detector_config,
    model_config,
    wait_for,
)

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

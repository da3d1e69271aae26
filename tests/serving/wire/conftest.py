"""serving.local on the wire: one server (both reference detectors, version 1) serves every test
of this package over loopback gRPC, through the official tensorflow_serving.apis stubs. It is
started once for the package (not per file) and stopped when the package's tests are done."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from tests.support.localserver import LocalServer, run_local_server


@pytest.fixture(scope="package")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("local-server")
    model_config = directory / "models.config"
    model_config.write_text(
        "model_config_list {\n"
        + "".join(
            f"  config {{ name: '{name}' base_path: '{model_repo / name}' "
            "model_platform: 'tensorflow' }\n"
            for name in ("detector", "detector_encoded")
        )
        + "}\n"
    )
    args = [f"--model_config_file={model_config}", "--enable_grpc_healthcheck_service"]
    with run_local_server(args, log_dir=directory) as server:
        yield server


@pytest.fixture(scope="package")
def channel(tfs: LocalServer) -> Iterator[grpc.Channel]:
    with tfs.channel() as channel:
        yield channel


@pytest.fixture(scope="package")
def prediction(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="package")
def models(channel: grpc.Channel) -> model_service_pb2_grpc.ModelServiceStub:
    return model_service_pb2_grpc.ModelServiceStub(channel)

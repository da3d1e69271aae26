"""The docs' command blocks that need what `make run` does not give, checked as printed
(tests/support/doccommands.py KINDS):

- `server`: a server the doc starts (`python -m serving.local ...`): started as printed in
  its own process group, checked once it serves the reference detector (AVAILABLE to TF
  Serving's GetModelStatus), then stopped; a block's servers start at once. Substituted: the
  doc's `--port 8500` (a free port), and `serving/models.config` by the file's own entry for
  the detector alone (the server answers once every model of its config is loaded: all of
  them would take minutes here; the whole file is what `make run` serves, tools/devrun.py).
- `moto`: S3 commands against moto's S3 server on loopback, the AWS client environment
  pointing at it (AWS_ENDPOINT_URL, as docs/deployment.md tells S3-compatible stores), the
  bucket holding the dataset; the gateway is the session's `make run`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import GET_MODEL_STATUS
from tests.support import doccommands, tools
from tests.support.doccommands import ROOT, Block
from tests.support.docworkspace import DATASET, Ports, Workspace, problems, run_block
from tests.support.localserver import HOST, free_port
from tests.support.makerun import MakeRun

pytestmark = pytest.mark.slow

SERVERS = doccommands.command_blocks("server")
S3_BLOCKS = doccommands.command_blocks("moto")
# TensorFlow's import and the detector's load with its warmup: ~15 s on 2 quiet cores.
SERVER_START_TIMEOUT = 240.0
SERVING_CONFIG = ROOT / "serving" / "models.config"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "foo",
    "AWS_SECRET_ACCESS_KEY": "foo",
    "AWS_REGION": "us-east-1",
}


def _available(port: int, model: str) -> bool:
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        status = channel.unary_unary(
            GET_MODEL_STATUS,
            request_serializer=tfs.GetModelStatusRequest.SerializeToString,
            response_deserializer=tfs.GetModelStatusResponse.FromString,
        )
        try:
            answer = status(
                tfs.GetModelStatusRequest(model_spec=tfs.ModelSpec(name=model)), timeout=5
            )
        except grpc.RpcError:
            return False
    return any(s.state == tfs.ModelVersionStatus.AVAILABLE for s in answer.model_version_status)


@pytest.mark.parametrize("block", SERVERS, ids=str)
def test_the_server_the_doc_starts_serves(block: Block, model_repo: Path, tmp_path: Path) -> None:
    workspace = Workspace(tmp_path, model_repo, files=False,
                          env={"TFS_LOCAL_BIND_HOST": HOST})  # fmt: skip
    config = workspace.directory / "detector.config"
    config.write_text(f"model_config_list {{\n{_entry(SERVING_CONFIG.read_text(), 'detector')}}}\n")
    with ExitStack() as stack:
        started = []
        for command in doccommands.shell_commands(block):
            # serving.local binds without SO_REUSEPORT: the port is found free, not held.
            port = free_port()
            assert "--port 8500" in command.text, f"{block.page.name}:{command.line}"
            text = workspace.substitute(command.text).replace("--port 8500", f"--port {port}")
            text = text.replace("serving/models.config", config.name)
            log = (tmp_path / f"server-{port}.log").open("wb")
            stack.callback(log.close)
            process = subprocess.Popen(
                ["bash", "-c", text], cwd=workspace.directory, env=workspace.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            stack.callback(_stop, process)
            started.append((command, port, process, tmp_path / f"server-{port}.log"))
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        for command, port, process, log_path in started:
            while not _available(port, "detector"):
                where = f"{block.page.name}:{command.line}"
                output = log_path.read_text(errors="replace")[-4000:]
                assert process.poll() is None, f"{where}: exited {process.returncode}\n{output}"
                assert time.monotonic() < deadline, f"{where}: not serving\n{output}"
                time.sleep(0.5)


def _entry(config: str, model: str) -> str:
    """The `config { ... }` entry of one model in a ModelServerConfig's text."""
    found = re.search(rf"^(\s*)config {{\n\s*name: '{model}'\n.*?^\1}}\n", config, re.M | re.S)
    assert found, f"no entry for {model} in {SERVING_CONFIG}"
    return found[0]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    moto_server = tools.module("moto.server", "the dev extra (make venv)")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address=HOST, port=port)
    server.start()
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.stop()


@pytest.mark.parametrize("block", S3_BLOCKS, ids=str)
def test_the_s3_block_runs_against_an_s3_server(
    block: Block, make_run: MakeRun, s3_endpoint: str, tmp_path: Path
) -> None:
    s3fs = tools.module("s3fs", "the dev extra (make venv)")
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint}
    ports = Ports(make_run.gateway_port, make_run.http_port, make_run.serving_port,
                  make_run.metrics_port)  # fmt: skip
    workspace = Workspace(tmp_path, make_run.models, ports, env=env)
    fs = s3fs.S3FileSystem(key="foo", secret="foo", endpoint_url=s3_endpoint)
    fs.mkdir("example-bucket")
    for name in DATASET:
        fs.pipe_file(f"example-bucket/street/{name}", (workspace.directory / name).read_bytes())
    found = [p for command, outcome in run_block(workspace, block)
             for p in problems(block, command, outcome)]  # fmt: skip
    assert not found, "\n\n".join(found)
    fs.invalidate_cache()
    assert fs.exists("example-bucket/street-results/_SUCCESS")
    lines = fs.cat_file("example-bucket/street-results/results-00000-of-00001.jsonl").splitlines()
    results = [json.loads(line) for line in lines]
    assert sorted(r["id"] for r in results) == sorted(DATASET)
    assert all(len(r["result"]["classes"]) == 3 for r in results), results

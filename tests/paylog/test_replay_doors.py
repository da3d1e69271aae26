"""Payload logging through the real doors (issue 35.3): a gateway process over the local TF
Serving logs requests from gRPC and HTTP to a file; `python -m gateway.paylog replay` turns
the log into detection-batch manifests, and detection-batch against the same gateway gives
the same results. A stalled sink (a FIFO nobody reads) costs no request; drops are counted.
Bad settings stop the gateway at startup naming the setting."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support import batch
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.localserver import LocalServer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # a gateway process, the local TF Serving, batch runners


@pytest.fixture(scope="module")
def tfs(reference_serving: LocalServer) -> LocalServer:
    """The run's local TF Serving with every reference model (tests/conftest.py)."""
    return reference_serving


def label_maps(model_repo: Path) -> str:
    label_map = model_repo / "detector" / "1" / "assets.extra" / "label_map.pbtxt"
    return f"--label-maps=detector={label_map}"


def scene_images(count: int) -> list[bytes]:
    rng = np.random.default_rng(35)
    return [
        scenes.encode(scenes.generate_scene(rng, 96, 80, 1 + i % 3).pixels, "JPEG")
        for i in range(count)
    ]


def wait_for_lines(path: Path, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if text.count("\n") >= count:
            return [json.loads(line) for line in text.splitlines()]
        assert time.monotonic() < deadline, f"{text.count(chr(10))} of {count} events logged"
        time.sleep(0.05)


def metric(gateway: GatewayProcess, name: str, labels: str) -> float:
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def without_request_id(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key != "request_id"}


def test_a_logged_day_replays_through_detection_batch_to_the_same_results(
    tfs: LocalServer, model_repo: Path, tmp_path: Path
) -> None:
    log = tmp_path / "payloads.jsonl"
    config = tmp_path / "paylog.toml"
    config.write_text('[default]\nrate = 1.0\nimages = "full"\n')
    args = [label_maps(model_repo), f"--payload-log={log}", f"--payload-log-config={config}"]
    images = scene_images(6)
    with run_gateway(tfs.target, args, log_dir=tmp_path, http=True) as gateway:
        with gateway.channel() as channel:
            stub = gateway.stub(channel)
            for image in images[:3]:  # gRPC, options given
                request = pb.DetectRequest(image=image, min_score=0.3, max_detections=5)
                stub.Detect(request, timeout=60)
            for image in images[3:5]:  # gRPC, the model's defaults
                stub.Detect(pb.DetectRequest(image=image), timeout=60)
            with pytest.raises(grpc.RpcError) as refused:  # an error is logged too
                stub.Detect(pb.DetectRequest(image=b"not an image", min_score=0.3,
                                             max_detections=5), timeout=60)  # fmt: skip
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        body = {"image": base64.b64encode(images[5]).decode(), "min_score": 0.3,
                "max_detections": 5}  # fmt: skip
        http = urllib.request.Request(
            gateway.http_url + "/v1/models/detector:detect",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(http, timeout=60) as answer:
            assert answer.status == 200
        events = wait_for_lines(log, 7)
        assert [e["code"] for e in events].count("INVALID_ARGUMENT") == 1

        out = tmp_path / "replay"
        replay = subprocess.run(
            [sys.executable, "-m", "gateway.paylog", "replay", str(log), str(out)],
            cwd=ROOT, env=batch.env(), capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr
        summary = json.loads((out / "replay.json").read_text())
        assert summary["skipped"] == []
        # Grouped by options and the version that answered; the refused image had none.
        groups = sorted((g["records"], g["version"], g["options"]["max_detections"])
                        for g in summary["groups"])  # fmt: skip
        assert groups == [(1, None, 5), (2, 1, 0), (4, 1, 5)]
        replayed = 0
        for group in summary["groups"]:
            command = shlex.split(group["command"])
            assert command[0] == "detection-batch"
            command = [gateway.target if a == "HOST:PORT" else a for a in command[1:]]
            batch.ok(batch.run(command))
            directory = out / group["directory"]
            expected = batch.lines(directory / "expected.jsonl")
            name = Path(group["directory"]).name
            got = batch.lines(out / "results" / name / "requests.jsonl.jsonl")
            assert len(got) == len(expected) == group["records"]
            for line, logged in zip(got, expected, strict=True):
                assert line["id"] == logged["id"]
                if logged["code"] == "OK":
                    assert "error" not in line, line["error"]
                    assert without_request_id(line["result"]) == without_request_id(
                        logged["result"]
                    )
                    assert line["result"]["detections"], "a scene with no detections proves little"
                else:
                    assert line["error"]["code"] == logged["error"]["code"]
                    assert line["error"]["message"] == logged["error"]["message"]
                replayed += 1
        assert replayed == 7


def test_hash_only_records_replay_from_an_images_directory_or_say_why_not(
    tfs: LocalServer, model_repo: Path, tmp_path: Path
) -> None:
    log = tmp_path / "payloads.jsonl"
    images = scene_images(2)
    args = [label_maps(model_repo), f"--payload-log={log}"]  # no config: hashes only
    with run_gateway(tfs.target, args, log_dir=tmp_path) as gateway:
        with gateway.channel() as channel:
            for image in images:
                gateway.stub(channel).Detect(pb.DetectRequest(image=image), timeout=60)
        events = wait_for_lines(log, 2)
    assert all("data" not in e["data"]["request"]["image"] for e in events)

    def replay(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.paylog", "replay", str(log), *extra],
            cwd=ROOT, env=batch.env(), capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip

    nothing = replay(str(tmp_path / "out1"))
    assert nothing.returncode == 1
    assert nothing.stderr.count("only the image's sha256") == 2
    assert "--images DIR" in nothing.stderr
    kept = tmp_path / "kept"
    kept.mkdir()
    digest = hashlib.sha256(images[0]).hexdigest()
    (kept / f"{digest}.jpg").write_bytes(images[0])
    partly = replay(str(tmp_path / "out2"), "--images", str(kept))
    assert partly.returncode == 1
    summary = json.loads((tmp_path / "out2" / "replay.json").read_text())
    assert [g["records"] for g in summary["groups"]] == [1]
    (skipped,) = summary["skipped"]
    assert skipped["request_id"] == events[1]["requestid"]
    assert "--images has no file of that name" in skipped["reason"]
    (line,) = batch.lines(tmp_path / "out2" / summary["groups"][0]["directory"] / "requests.jsonl")
    assert line["image"] == str(kept / f"{digest}.jpg")
    with run_gateway(tfs.target, args[:1], log_dir=tmp_path) as gateway:
        command = shlex.split(summary["groups"][0]["command"])[1:]
        batch.ok(batch.run([gateway.target if a == "HOST:PORT" else a for a in command]))
    name = Path(summary["groups"][0]["directory"]).name
    (result,) = batch.lines(tmp_path / "out2" / "results" / name / "requests.jsonl.jsonl")
    assert without_request_id(result["result"]) == without_request_id(
        events[0]["data"]["response"]["result"]
    )


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """An HTTP sink that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(64)  # connections wait in the backlog, never accepted, never answered
    yield f"http://127.0.0.1:{server.getsockname()[1]}/"
    server.close()


@pytest.mark.parametrize("sink", ["fifo", "silent-http"])
def test_a_sink_nobody_reads_costs_no_request_and_drops_are_counted(
    tfs: LocalServer, model_repo: Path, tmp_path: Path, silent_collector: str, sink: str
) -> None:
    if sink == "fifo":
        target = str(tmp_path / "payloads.fifo")
        os.mkfifo(target)
    else:
        target = silent_collector
    config = tmp_path / "paylog.toml"
    config.write_text('[default]\nimages = "full"\n')
    # The HTTP sink's timeout outlasts the requests: its first POST holds the writer.
    args = [label_maps(model_repo), f"--payload-log={target}", f"--payload-log-config={config}",
            f"--payload-log-queue-bytes={1 << 20}", "--payload-log-timeout=120"]  # fmt: skip
    image = scenes.encode(np.random.default_rng(3).integers(0, 255, (256, 256, 3), np.uint8))
    assert len(image) > 150_000  # noise: about 200 KB as PNG; 5 records fill the budget
    with run_gateway(tfs.target, args, log_dir=tmp_path) as gateway:
        with gateway.channel() as channel:
            stub = gateway.stub(channel)
            for _ in range(20):
                result = stub.Detect(pb.DetectRequest(image=image), timeout=60)
                assert result.model.name == "detector"
        records = 'result="{}"'
        queued = metric(
            gateway, "vision_gateway_payload_log_records_total", records.format("queued")
        )
        dropped = metric(
            gateway, "vision_gateway_payload_log_records_total", records.format("dropped")
        )
        assert queued >= 1 and dropped >= 1 and queued + dropped == 20
        assert metric(gateway, "vision_gateway_payload_log_queue_bytes", "") <= 1 << 20


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--payload-log=/no/such/directory/payloads.jsonl", "GATEWAY_PAYLOAD_LOG="),
        ("--payload-log-config={tmp}/missing.toml", "GATEWAY_PAYLOAD_LOG_CONFIG: cannot read"),
        ("--payload-log=ftp-nope://x", "GATEWAY_PAYLOAD_LOG="),
    ],
)
def test_bad_settings_stop_the_gateway_at_startup_naming_them(
    flag: str, named: str, tmp_path: Path
) -> None:
    args = [flag.format(tmp=tmp_path)]
    if "config" in flag:
        args.append(f"--payload-log={tmp_path / 'payloads.jsonl'}")
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "--port=0", "--http-port=0", "--metrics-port=0", *args],
        cwd=ROOT, env=batch.env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode != 0
    assert named in run.stderr and "Traceback" not in run.stderr

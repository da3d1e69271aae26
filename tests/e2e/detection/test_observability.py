"""What an operator and other clients see of the whole path (conftest.py): one JSON log line
per request without image bytes, Prometheus metrics, no TensorFlow in the gateway process,
grpcurl with reflection only, the Python client's command line."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from google.protobuf import json_format

from gateway.proto.detection.v1 import detection_pb2 as pb
from serving import scenes
from tests.support import tools
from tests.support.detections import assert_matches, detect, log_lines, scene_for

# --- observability and external clients -------------------------------------------------


def test_one_json_log_line_per_request_without_image_bytes(stub, gateway):
    data = scenes.encode(scene_for(96).pixels, "PNG")
    detect(stub, data, request_id="log-check")
    [line] = log_lines(gateway, "log-check")
    assert line["method"] == "Detect" and line["code"] == "OK"
    assert line["model"] == "detector" and line["version"] == 2
    assert set(line["latency_ms"]) == {"decode", "upstream", "total"}
    assert base64.b64encode(data[:64]).decode() not in gateway.log_path.read_text()


def test_prometheus_metrics_count_requests_and_stage_latency(stub, gateway):
    detect(stub, scenes.encode(scene_for(97).pixels, "PNG"))
    url = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'vision_gateway_requests_total{code="OK",method="Detect"}' in text
    for stage in ("decode", "upstream", "total"):
        assert f'vision_gateway_latency_seconds_count{{method="Detect",stage="{stage}"}}' in text
    assert "vision_gateway_in_flight_requests" in text


def test_running_gateway_never_loads_tensorflow(stub, gateway):
    detect(stub, scenes.encode(scene_for(98).pixels, "JPEG"))
    maps = Path(f"/proc/{gateway.process.pid}/maps").read_text()
    assert "tensorflow" not in maps
    assert "_message" in maps or "upb" in maps or "protobuf" in maps  # it is the right process


def test_grpcurl_with_reflection_only(gateway):
    grpcurl = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    listed = subprocess.run(
        [grpcurl, "-plaintext", gateway.target, "list"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert "detection.v1.DetectionService" in listed.stdout.split()
    scene = scene_for(99, 640, 480, 6)
    body = json.dumps(
        {"image": base64.b64encode(scenes.encode(scene.pixels, "JPEG")).decode(), "min_score": 0.5}
    )
    out = subprocess.run(
        [grpcurl, "-plaintext", "-max-msg-sz", "67108864", "-d", "@", gateway.target,
         "detection.v1.DetectionService/Detect"],
        input=body, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # grpcurl prints proto3 JSON; the official parser reads it back into the message.
    result = json_format.Parse(out.stdout, pb.DetectionResult())
    assert_matches(result, scene)


def test_python_client_cli_prints_json_lines(gateway, tmp_path):
    scene = scene_for(100)
    path = tmp_path / "scene.png"
    path.write_bytes(scenes.encode(scene.pixels, "PNG"))
    out = subprocess.run(
        [sys.executable, "-m", "gateway.client", str(path), str(path), "--target", gateway.target],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2
    assert lines[0]["image"] == str(path)
    assert len(lines[0]["detections"]) == len(scene.boxes)

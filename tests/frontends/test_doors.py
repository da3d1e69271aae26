"""The two doors over one pipeline, in the test process: the same results and the same error
kinds whichever door a request comes in by, each door's own status for a kind, readiness on
both, and one request log line per image."""

from __future__ import annotations

import io
import json
import logging
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.doors import InProcessDoors


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(out, "PNG")
    return out.getvalue()


def as_json(message: object) -> dict:
    return json_format.MessageToDict(  # type: ignore[arg-type]
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def post(doors: InProcessDoors, path: str, image: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        doors.http_url + path, data=image, headers={"Content-Type": "image/png"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def grpc_call(doors: InProcessDoors, method: str, request: object) -> tuple[object, object]:
    """(result, None) or (None, the RpcError)."""
    with grpc.insecure_channel(doors.grpc_target) as channel:
        stubs = {
            "Detect": pb_grpc.DetectionServiceStub(channel).Detect,
            "Classify": cpb_grpc.ClassificationServiceStub(channel).Classify,
        }
        try:
            return stubs[method](request, timeout=60), None
        except grpc.RpcError as e:
            return None, e


def without_request_id(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "request_id"}


def test_both_doors_give_the_same_detections_in_the_images_pixels(doors: InProcessDoors) -> None:
    image = png(200, 100, (90, 90, 90))
    result, error = grpc_call(doors, "Detect", pb.DetectRequest(image=image))
    assert error is None
    status, body = post(doors, "/v1/models/detector:detect", image)
    assert status == 200, body
    assert without_request_id(body) == without_request_id(as_json(result))
    [detection] = body["detections"]
    assert detection["box"] == {"x_min": 50, "y_min": 25, "x_max": 150, "y_max": 75}
    assert (detection["class_id"], detection["label"]) == (1, "a box")
    assert (body["image_width"], body["image_height"]) == (200, 100)


def test_both_doors_give_the_same_classes(doors: InProcessDoors) -> None:
    image = png(64, 48, (200, 40, 20))
    result, error = grpc_call(doors, "Classify", cpb.ClassifyRequest(image=image))
    assert error is None
    status, body = post(doors, "/v1/models/colours:classify", image)
    assert status == 200, body
    assert without_request_id(body) == without_request_id(as_json(result))
    assert [c["label"] for c in body["classes"]] == ["red", "green", "blue"]
    assert body["classes"][0]["score"] == pytest.approx(200 / 260, abs=1e-3)


@pytest.mark.parametrize(
    ("case", "grpc_code", "http_status", "text"),
    [
        ("empty image", grpc.StatusCode.INVALID_ARGUMENT, 400, "image is empty"),
        ("not an image", grpc.StatusCode.INVALID_ARGUMENT, 400, "could not be decoded"),
        ("over the pixel limit", grpc.StatusCode.INVALID_ARGUMENT, 413, "megapixels"),
        ("unknown model", grpc.StatusCode.NOT_FOUND, 404, "'nowhere'"),
        ("a classifier asked to detect", grpc.StatusCode.FAILED_PRECONDITION, 400, "colours"),
    ],
)
def test_each_error_kind_gets_each_doors_own_status(
    doors: InProcessDoors, case: str, grpc_code: grpc.StatusCode, http_status: int, text: str
) -> None:
    image, model = {
        "empty image": (b"", "detector"),
        "not an image": (b"plain text, not an image", "detector"),
        "over the pixel limit": (png(1200, 1000, (0, 0, 0)), "detector"),
        "unknown model": (png(8, 8, (0, 0, 0)), "nowhere"),
        "a classifier asked to detect": (png(8, 8, (0, 0, 0)), "colours"),
    }[case]
    request = pb.DetectRequest(image=image, model=model_pb2.ModelSpec(name=model))
    _, error = grpc_call(doors, "Detect", request)
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc_code, error.details()
    status, body = post(doors, f"/v1/models/{model}:detect", image)
    assert status == http_status, body
    assert body["error"]["code"] == grpc_code.name
    # One message whichever door: what was wrong, for a person to act on.
    assert text in body["error"]["message"] and body["error"]["message"] == error.details()


def test_both_doors_report_readiness_from_the_default_models_status(
    doors: InProcessDoors,
) -> None:
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(doors.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest(service="detection.v1.DetectionService")
        while health.Check(check, timeout=10).status != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "never SERVING"
            time.sleep(0.05)
    with urllib.request.urlopen(doors.http_url + "/ping", timeout=10) as response:
        assert response.status == 200


def test_one_request_log_line_per_image_whichever_door(
    doors: InProcessDoors, caplog: pytest.LogCaptureFixture
) -> None:
    image = png(32, 32, (10, 200, 10))
    with caplog.at_level(logging.INFO, logger="gateway.request"):
        grpc_call(doors, "Detect", pb.DetectRequest(image=image, request_id="by-grpc"))
        post(doors, "/v1/models/detector:detect?request_id=by-http", image)
    lines = {
        r.fields["request_id"]: r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "gateway.request"
    }
    assert lines["by-grpc"]["method"] == "Detect"
    assert lines["by-http"]["method"] == "POST :detect"
    for fields in lines.values():
        assert (fields["code"], fields["model"], fields["detections"]) == ("OK", "detector", 1)

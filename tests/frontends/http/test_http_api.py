"""The HTTP door end to end: urllib and the real `curl` -> gateway (HTTP) -> local TF Serving:
every body type and every model route give the gRPC door's detections and classes, with every
field printed.

The rest of the door's end-to-end tests: test_http_formats.py (/invocations, /ping, model
status, OpenAPI, MessagePack, request ids and trace headers, metrics) and test_http_errors.py
(the errors a healthy upstream gives, and curl's uploads).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
from google.protobuf import json_format

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.frontends.http.conftest import classifiers
from tests.support.httpcalls import (
    JPEG,
    PNG,
    assert_scene,
    call,
    comparable,
    error_of,
    grpc_detect,
    multipart,
    ok_json,
)

BODIES = {
    "raw jpeg": lambda: (JPEG, "image/jpeg", "?min_score=0.5&max_detections=20"),
    "raw png": lambda: (PNG, "image/png", "?min_score=0.5&max_detections=20"),
    "octet-stream": lambda: (JPEG, "application/octet-stream", "?min_score=0.5&max_detections=20"),
    "x-image": lambda: (JPEG, "application/x-image", "?min_score=0.5&max_detections=20"),
    "json base64": lambda: (
        json.dumps(
            {"image": base64.b64encode(JPEG).decode(), "min_score": 0.5, "max_detections": 20}
        ).encode(),
        "application/json",
        "",
    ),
    "json b64 object": lambda: (
        json.dumps(
            {
                "image": {"b64": base64.b64encode(JPEG).decode()},
                "minScore": 0.5,
                "maxDetections": 20,
            }
        ).encode(),
        "application/json; charset=utf-8",
        "",
    ),
    "msgpack": lambda: (
        msgpack.packb({"image": JPEG, "min_score": 0.5, "max_detections": 20}),
        "application/x-msgpack",
        "",
    ),
    "msgpack alias": lambda: (
        msgpack.packb({"image": JPEG, "min_score": 0.5}),
        "application/msgpack",
        "?max_detections=20",
    ),
    "multipart": lambda: (*multipart({"min_score": "0.5", "max_detections": "20"}, JPEG), ""),
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_every_body_type_gives_the_grpc_door_s_detections(gateway, channel, kind) -> None:
    body, content_type, query = BODIES[kind]()
    image = PNG if kind == "raw png" else JPEG
    expected = grpc_detect(channel, image, min_score=0.5, max_detections=20)
    status, headers, raw = call(
        gateway,
        "/v1/models/detector:detect" + query,
        body,
        content_type,
        headers={"Accept": "application/json"},
    )
    result = ok_json((status, headers, raw))
    if "msgpack" in kind:  # MessagePack requests get their (here empty) metadata back
        assert result.pop("metadata") == {}
    assert comparable(result) == expected
    assert_scene(result)
    assert result["model"] == {"name": "detector", "version": "1"}


def test_results_print_every_field_even_zeros(gateway) -> None:
    # A rectangle in the top-left corner: its box starts at x_min = y_min = 0.
    pixels = np.full((120, 160, 3), 128, np.uint8)
    pixels[0:30, 0:40] = scenes.PALETTE[0].rgb
    result = ok_json(
        call(gateway, "/v1/models/detector:detect", scenes.encode(pixels, "PNG"), "image/png")
    )
    (detection,) = result["detections"]
    assert detection["box"] == {"x_min": 0, "y_min": 0, "x_max": 40, "y_max": 30}
    assert detection["normalized_box"]["x_min"] == 0
    empty = ok_json(
        call(
            gateway,
            "/v1/models/detector:detect",
            scenes.encode(pixels[60:, 60:], "PNG"),
            "image/png",
        )
    )
    assert empty["detections"] == []


def test_version_and_label_routes_name_the_version(gateway, channel) -> None:
    expected = grpc_detect(channel, JPEG, model=model_pb2.ModelSpec(name="detector", version=1))
    for path in (
        "/v1/models/detector/versions/1:detect",
        "/v1/models/detector/labels/stable:detect",
    ):
        result = ok_json(call(gateway, path, JPEG, "image/jpeg"))
        assert comparable(result) == expected
        assert result["model"]["version"] == "1"
    message = error_of(
        call(gateway, "/v1/models/detector/versions/7:detect", JPEG, "image/jpeg"), 404, "NOT_FOUND"
    )
    assert "version 7" in message
    message = error_of(
        call(gateway, "/v1/models/detector/labels/beta:detect", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "beta" in message
    message = error_of(
        call(gateway, "/v1/models/detector/versions/one:detect", JPEG, "image/jpeg"),
        400,
        "INVALID_ARGUMENT",
    )
    assert "version in the path" in message


def test_encoded_model_route(gateway, channel) -> None:
    expected = grpc_detect(channel, JPEG, model=model_pb2.ModelSpec(name="detector_encoded"))
    result = ok_json(call(gateway, "/v1/models/detector_encoded:detect", JPEG, "image/jpeg"))
    assert comparable(result) == expected
    assert_scene(result)


def colour_image(shares: dict[tuple[int, int, int], int], width: int = 100) -> bytes:
    """A PNG whose rows are painted in the given colours, `share` rows each (100 rows)."""
    rows = [np.full((count, width, 3), rgb, np.uint8) for rgb, count in shares.items()]
    return scenes.encode(np.concatenate(rows), "PNG")


@pytest.mark.parametrize("route", ["/v1/models/{m}:classify", "/v1/models/{m}/versions/1:classify"])
def test_classify_gives_the_grpc_door_s_classes(gateway, channel, http_repo: Path, route) -> None:
    image = colour_image({(20, 20, 240): 70, (240, 20, 20): 30})
    stub = cpb_grpc.ClassificationServiceStub(channel)
    for name in classifiers(http_repo):
        expected = stub.Classify(
            cpb.ClassifyRequest(image=image, top_k=3, model=model_pb2.ModelSpec(name=name)),
            timeout=60,
        )
        expected_dict = comparable(
            json_format.MessageToDict(
                expected,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
        )
        result = ok_json(call(gateway, route.format(m=name) + "?top_k=3", image, "image/png"))
        assert comparable(result) == expected_dict, name
        assert result["classes"][0]["label"] == "blue", name
    colours = ok_json(call(gateway, route.format(m="colours") + "?top_k=3", image, "image/png"))
    assert [(c["label"], round(c["score"], 4)) for c in colours["classes"]] == [
        ("blue", 0.7),
        ("red", 0.3),
        ("green", 0.0),
    ]


def test_classify_as_msgpack_with_metadata(gateway) -> None:
    image = colour_image({(20, 240, 20): 100})
    body = msgpack.packb({"image": image, "top_k": 1, "frame": 17, "camera": "cam-7"})
    status, headers, raw = call(gateway, "/v1/models/colours:classify", body, "application/msgpack")
    assert status == 200 and headers["content-type"] == "application/x-msgpack"
    result = msgpack.unpackb(raw)
    assert result["classes"] == [{"class_id": 1, "label": "green", "score": 1.0}]
    assert result["metadata"] == {"frame": 17, "camera": "cam-7"}


def test_a_detection_model_on_the_classify_route_is_refused(gateway) -> None:
    message = error_of(
        call(gateway, "/v1/models/detector:classify", JPEG, "image/jpeg"),
        400,
        "FAILED_PRECONDITION",
    )
    assert "detector" in message

"""The one proto3 JSON form (gateway.api.protojson): proto field names, every field present,
int64 as strings; what the HTTP door answers and batch lines and the payload log hold."""

from __future__ import annotations

import json

from gateway.api.protojson import to_dict
from gateway.frontends.http.responses import to_json
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import model_pb2


def test_every_field_under_its_proto_name() -> None:
    result = pb.DetectionResult(request_id="r", image_width=4)
    found = to_dict(result)
    assert found["request_id"] == "r" and found["image_width"] == 4
    assert found["image_height"] == 0 and found["detections"] == []
    assert "requestId" not in found
    assert to_dict(bpb.UploadImagesResponse(image_count=3))["image_count"] == "3"


def test_the_http_door_writes_the_same_form() -> None:
    result = pb.DetectionResult(request_id="r", model=model_pb2.ServedModel(name="m", version=2))
    assert json.loads(to_json(result)) == to_dict(result)

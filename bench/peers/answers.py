"""Every server's answer as one typed dict (detections with pixel boxes, labels, scores, the
image size), and the answer every server must give: the bench upstream's fixed outputs
through the OD API mapping."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import grpc
from google.protobuf import json_format

from bench import load
from bench import upstream as bench_upstream
from bench.peers import odapi
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs

Answer = dict[str, Any]


def expected(width: int, height: int) -> Answer:
    """What every server must answer for an image of that size: the bench upstream's fixed
    outputs through the same mapping (min_score 0.5, pixel edges rounded half up)."""
    response = tfs.PredictResponse.FromString(bench_upstream.predict_response(odapi.MODEL))
    return {
        "detections": odapi.detections(response, width, height),
        "image_width": width,
        "image_height": height,
    }


def same(answer: Answer, want: Answer) -> bool:
    def key(a: Answer) -> list[tuple[Any, ...]]:
        return [
            (d["class_id"], d["label"], tuple(d["box"][k] for k in sorted(d["box"])))
            for d in a["detections"]
        ]

    scores_match = all(
        abs(a["score"] - b["score"]) < 1e-6
        for a, b in zip(answer["detections"], want["detections"], strict=False)
    )
    return (
        key(answer) == key(want)
        and scores_match
        and (answer["image_width"], answer["image_height"]) == (want["image_width"],
                                                                want["image_height"])
    )  # fmt: skip


def _detect_answer(result: pb.DetectionResult) -> Answer:
    data = json_format.MessageToDict(
        result, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return typed(data)


def typed(data: dict[str, Any]) -> Answer:
    return {
        "detections": [
            {k: d[k] for k in ("class_id", "label", "score", "box")} for d in data["detections"]
        ],
        "image_width": data["image_width"],
        "image_height": data["image_height"],
    }


def post_json(url: str, body: bytes) -> Any:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def mlserver_rest_answer(data: dict[str, Any]) -> Answer:
    outputs = {o["name"]: o["data"] for o in data["outputs"]}
    boxes = outputs["boxes"]
    return {
        "detections": [
            {
                "class_id": class_id,
                "label": label,
                "score": score,
                "box": dict(
                    zip(("x_min", "y_min", "x_max", "y_max"), boxes[4 * i : 4 * i + 4], strict=True)
                ),
            }
            for i, (class_id, label, score) in enumerate(
                zip(outputs["class_ids"], outputs["labels"], outputs["scores"], strict=True)
            )
        ],
        "image_width": outputs["image_size"][0],
        "image_height": outputs["image_size"][1],
    }


def grpc_probe(target: str, body: bytes) -> Answer:
    with grpc.insecure_channel(target, options=load.CHANNEL_OPTIONS) as channel:
        raw = channel.unary_unary(load.DETECT)(body, timeout=60)
    return _detect_answer(pb.DetectionResult.FromString(raw))

"""The work every peer does around TF Serving, written as their documentation's examples write
it: the image decoded by Pillow into `np.array`, the PredictRequest built with
`tf.make_tensor_proto`, the OD API outputs read with `np.array(float_val)` and turned into
the typed answer (pixel boxes of the image, labels, scores, best first).

Imported by each peer in its own venv (numpy and Pillow only; TensorFlow and the official
`tensorflow_serving.apis` modules are passed in by the peer that imported them), so the
three do the same work and differ only in the server around it.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

MODEL = "pixels"  # bench/upstream.py's uint8 [1,-1,-1,3] model
SIGNATURE = "serving_default"
INPUT = "input_tensor"
BOXES, CLASSES, SCORES, NUM = (
    "detection_boxes",
    "detection_classes",
    "detection_scores",
    "num_detections",
)
OUTPUTS = (BOXES, CLASSES, SCORES, NUM)
# The gateway's defaults (GATEWAY_MIN_SCORE, GATEWAY_MAX_DETECTIONS), so all answer alike.
MIN_SCORE = 0.5
MAX_DETECTIONS = 100
# Large images on every hop (a 1080p uint8 tensor is 6.2 MB; gRPC's default cap is 4 MiB).
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]

Detection = dict[str, Any]  # class_id, label, score, box


def decode(data: bytes) -> np.ndarray:
    """RGB pixels [height, width, 3], uint8."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    return np.array(image)


def predict_request(pixels: np.ndarray, tf: Any, predict_pb2: Any) -> Any:
    """The official PredictRequest for one image, as TF Serving's client examples build it."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = SIGNATURE
    request.inputs[INPUT].CopyFrom(tf.make_tensor_proto(pixels[np.newaxis]))
    request.output_filter.extend(OUTPUTS)
    return request


def detections(response: Any, width: int, height: int) -> list[Detection]:
    """The official PredictResponse's OD API outputs as detections of a width x height image:
    class id, label, score, box in pixels (max exclusive), best first."""
    outputs = response.outputs
    found = int(np.array(outputs[NUM].float_val)[0])
    boxes = np.array(outputs[BOXES].float_val).reshape(-1, 4)[:found]
    scores = np.array(outputs[SCORES].float_val)[:found]
    classes = np.array(outputs[CLASSES].float_val)[:found]
    result: list[Detection] = []
    for (ymin, xmin, ymax, xmax), score, class_value in zip(boxes, scores, classes, strict=True):
        if score < MIN_SCORE:
            continue
        class_id = round(float(class_value))
        result.append(
            {
                "class_id": class_id,
                "label": f"class_{class_id}",
                "score": float(score),
                "box": {
                    "x_min": int(np.clip(xmin, 0, 1) * width + 0.5),
                    "y_min": int(np.clip(ymin, 0, 1) * height + 0.5),
                    "x_max": int(np.clip(xmax, 0, 1) * width + 0.5),
                    "y_max": int(np.clip(ymax, 0, 1) * height + 0.5),
                },
            }
        )
    result.sort(key=_score, reverse=True)
    return result[:MAX_DETECTIONS]


def _score(detection: Detection) -> float:
    return float(detection["score"])

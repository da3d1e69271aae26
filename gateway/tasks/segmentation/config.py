"""The instance segmentation task's model-config keys: detection's (`min_score`,
`max_detections`, and in [models.NAME.outputs] the box, score and class outputs:
gateway.tasks.detection.config) plus, in [models.NAME.outputs]:
- `masks`: the output of box-relative mask probabilities `[batch, N, m, m]`, row for row
  with the boxes (default `detection_masks`, as TF Model Garden and OD API Mask R-CNN
  exports name it);
- `mask_threshold`: a pixel is in the mask when its probability is above this, in (0, 1)
  (default 0.5; requests may ask for another);
- `decoder = "yolo-seg"` for a YOLOv8/11-seg raw head `[batch, 4 + classes + M, candidates]`
  with its prototypes `[batch, M, h, w]` or `[batch, h, w, M]`; `predictions` and
  `prototypes` name them where the signature's shapes do not say (`nms_iou`,
  `max_candidates` as for detection's `yolo`), and `mask_resolution`: `"native"` (the
  default; Ultralytics' `retina_masks=True`, `process_mask_native`: the logits upsampled to the
  image's own pixels, then kept in the box) or `"input"` (its predictor's default,
  `process_mask`: upsampled to the input the model received, thresholded and kept in the box
  there, then that mask scaled to the image). Refused with any other decoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError
from gateway.tasks.detection.config import REQUEST_DEFAULTS as DETECTION_DEFAULTS
from gateway.tasks.detection.config import OnDetection, read_on_detection

DEFAULT_MASK_THRESHOLD = 0.5
YOLO_SEG = "yolo-seg"
DECODERS = (YOLO_SEG,)
NATIVE = "native"
INPUT = "input"
MASK_RESOLUTIONS = (NATIVE, INPUT)
OUTPUT_KEYS = ("masks", "mask_threshold", "predictions", "prototypes", "mask_resolution")


@dataclass(frozen=True)
class SegmentationConfig(OnDetection):
    masks: str | None = None
    mask_threshold: float = DEFAULT_MASK_THRESHOLD
    predictions: str | None = None  # yolo-seg's head
    prototypes: str | None = None
    mask_resolution: str = NATIVE  # yolo-seg's


DEFAULT = SegmentationConfig()
REQUEST_DEFAULTS = DETECTION_DEFAULTS  # detection's: --min-score, --max-detections


def read_config(table: Mapping[str, Any], path: Path, where: str) -> SegmentationConfig:
    detection, extra, names, where = read_on_detection(
        table, path, where, OUTPUT_KEYS, ("masks", "predictions", "prototypes"), DECODERS
    )
    decoder = detection.outputs.decoder
    if decoder is None and names.keys() & {"predictions", "prototypes"}:
        raise ModelConfigError(
            f"{path}: {where}.predictions and .prototypes name the outputs of decoder = "
            f"'{YOLO_SEG}'; set that decoder, or remove them"
        )
    if decoder is not None and "masks" in names:
        raise ModelConfigError(
            f"{path}: {where}.decoder = '{decoder}' makes the masks from the head's "
            "coefficients and prototypes; remove masks"
        )
    resolution = extra.get("mask_resolution", NATIVE)
    if "mask_resolution" in extra and decoder != YOLO_SEG:
        raise ModelConfigError(
            f"{path}: {where}.mask_resolution chooses how decoder = '{YOLO_SEG}' scales its "
            "prototype masks; box-relative masks are pasted into their boxes: remove "
            "mask_resolution, or set that decoder"
        )
    if resolution not in MASK_RESOLUTIONS:
        raise ModelConfigError(
            f"{path}: {where}.mask_resolution must be one of "
            f"{', '.join(repr(r) for r in MASK_RESOLUTIONS)}, got {resolution!r}"
        )
    threshold = extra.get("mask_threshold", DEFAULT_MASK_THRESHOLD)
    if (
        not isinstance(threshold, int | float)
        or isinstance(threshold, bool)
        or not 0.0 < threshold < 1.0
    ):
        raise ModelConfigError(
            f"{path}: {where}.mask_threshold must be a number above 0 and below 1, "
            f"got {threshold!r}"
        )
    return SegmentationConfig(
        detection, mask_threshold=float(threshold), mask_resolution=resolution, **names
    )

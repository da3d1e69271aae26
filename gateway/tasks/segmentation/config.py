"""The instance segmentation task's model-config keys: detection's (`min_score`,
`max_detections`, and in [models.NAME.outputs] the box, score and class outputs:
gateway.tasks.detection.config) plus, in [models.NAME.outputs]:
- `masks`: the output of box-relative mask probabilities `[batch, N, m, m]`, row for row
  with the boxes (default `detection_masks`, as TF Model Garden and OD API Mask R-CNN
  exports name it);
- `mask_threshold`: a pixel is in the mask when its probability is above this, in (0, 1)
  (default 0.5; requests may ask for another).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.models.values import ModelConfigError
from gateway.tasks.detection.config import DetectionConfig, read_detection_config

DEFAULT_MASK_THRESHOLD = 0.5
OUTPUT_KEYS = ("masks", "mask_threshold")


@dataclass(frozen=True)
class SegmentationConfig:
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    masks: str | None = None
    mask_threshold: float = DEFAULT_MASK_THRESHOLD


DEFAULT = SegmentationConfig()


def read_config(table: Mapping[str, Any], path: Path, where: str) -> SegmentationConfig:
    detection, _, extra = read_detection_config(
        table, path, where, extra_outputs=OUTPUT_KEYS, decoders=()
    )
    where = where + ".outputs"
    masks = extra.get("masks")
    if masks is not None and (not isinstance(masks, str) or not masks):
        raise ModelConfigError(f"{path}: {where}.masks must name an output of the signature")
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
    return SegmentationConfig(detection, masks, float(threshold))

"""The instance segmentation task: instances (box, class, score) with a mask each in pixels
of the image as a viewer shows it, from Mask R-CNN-style box-relative masks
(gateway.tasks.segmentation.plans); min_score and max_detections are checked as detection's,
mask_threshold and mask_format here."""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway import errors
from gateway.domain import Cost, Frame, Located, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.tasks.base import FolderTask
from gateway.tasks.detection.task import DETECTION_BYTES, resolve_options
from gateway.tasks.segmentation.compare import compare_segments
from gateway.tasks.segmentation.config import SegmentationConfig
from gateway.tasks.segmentation.mapping import map_segments
from gateway.tasks.segmentation.nouns import (
    MASK_FORMATS,
    RLE,
    SegmentOptions,
    Segments,
    SegmentSettings,
)
from gateway.tasks.segmentation.plans import plan_segmentation


def resolve_segment(
    options: SegmentOptions, own: SegmentationConfig, rules: Rules
) -> SegmentSettings:
    detection = resolve_options(options, own.detection, rules)
    threshold = options.mask_threshold
    if math.isnan(threshold) or not 0.0 <= threshold < 1.0:
        raise errors.invalid_input(
            f"mask_threshold must be in [0, 1) (0 means the model's default "
            f"{own.mask_threshold}), got {threshold}"
        )
    mask_format = options.mask_format.lower() or RLE
    if mask_format not in MASK_FORMATS:
        raise errors.invalid_input(
            f"mask_format must be one of {', '.join(MASK_FORMATS)} (empty: {RLE}), got "
            f"{options.mask_format[:40]!r}"
        )
    return SegmentSettings(
        detection.min_score,
        detection.max_detections,
        threshold or own.mask_threshold,
        mask_format,
        rules.limits,
    )


def segmentation_cost(options: SegmentSettings, frame: Frame) -> Cost:
    """The image decoded; at most max_detections masks, each at most the whole image, within
    the model's max_mask_pixels and max_answer_bytes (the mapping cuts at them)."""
    pixels = frame.width * frame.height
    mask_pixels = options.max_detections * pixels
    answer = options.max_detections * (pixels + DETECTION_BYTES)
    if options.limits is not None:
        mask_pixels = min(mask_pixels, options.limits.max_mask_pixels)
        answer = min(answer, options.limits.max_answer_bytes)
    return Cost(pixels, mask_pixels, answer, options.max_detections)


class SegmentationTask(FolderTask[SegmentationConfig]):
    compare = staticmethod(compare_segments)
    map_in_thread = True  # a mask per instance: milliseconds each

    def resolve(
        self, options: SegmentOptions, config: ModelConfig, rules: Rules
    ) -> SegmentSettings:
        return resolve_segment(options, self.own(config), rules)

    plan_outputs = staticmethod(plan_segmentation)

    map = staticmethod(map_segments)

    def cost(
        self, options: SegmentSettings, frame: Frame, plan: OutputPlan, config: ModelConfig
    ) -> Cost:
        return segmentation_cost(options, frame)

    finds_instances = True

    def instances(self, result: Segments) -> Sequence[Located]:
        return result.instances

    def summary(self, result: Segments) -> dict[str, object]:
        fields: dict[str, object] = {"instances": len(result.instances)}
        if result.truncated is not None:
            fields["left_out"] = {"instances": result.truncated.left_out,
                                  "limit": result.truncated.limit}  # fmt: skip
        return fields

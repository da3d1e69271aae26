"""The detection task: a request's options completed with the model's defaults, the output
plan of a model version (gateway.tasks.detection.plans), and its outputs mapped to
detections per request by the plan's form (od_api, or forms for the others)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gateway import errors
from gateway.domain import Cost, Frame, Located, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.tasks.base import FolderTask
from gateway.tasks.detection.compare import compare_detections
from gateway.tasks.detection.config import MAX_DETECTIONS, MIN_SCORE, DetectionConfig
from gateway.tasks.detection.forms import map_decoded
from gateway.tasks.detection.nouns import Detections, DetectionSettings, DetectOptions, Kept
from gateway.tasks.detection.od_api import map_detections
from gateway.tasks.detection.plans import DetectionPlan, plan_outputs
from gateway.upstream.tensors import Tensor

# Bytes of one detection in an answer at most (box, normalized box, label, score: ~150 in
# proto JSON with a long label), for Cost.answer_bytes.
DETECTION_BYTES = 200


def resolve_options(options: Kept, own: DetectionConfig, rules: Rules) -> DetectionSettings:
    """A request's min_score and max_detections checked and completed with the model's
    defaults, else the gateway's (--min-score, --max-detections); max_detections within the
    model's ceiling (limits), which a caller cannot raise and a default does not pass; for
    tasks built on detection too."""
    limits = rules.limits
    min_score = own.min_score if own.min_score is not None else float(rules.default(MIN_SCORE))
    ceiling = limits.max_detections
    max_detections = min(own.max_detections or int(rules.default(MAX_DETECTIONS)), ceiling)
    if options.max_detections > ceiling:
        raise errors.too_costly(
            f"max_detections is {options.max_detections}, over model '{limits.model}''s limit "
            f"of {ceiling} detections per image; ask for at most {ceiling}, or have the "
            f"operator raise {limits.setting('max_detections')}"
        )
    if math.isnan(options.min_score) or not 0.0 <= options.min_score <= 1.0:
        raise errors.invalid_input(
            f"min_score must be in [0, 1] (0 means the server default {min_score}), "
            f"got {options.min_score}"
        )
    if options.max_detections < 0:
        raise errors.invalid_input(
            f"max_detections must be >= 0 (0 means the server default "
            f"{max_detections}), got {options.max_detections}"
        )
    return DetectionSettings(
        min_score=options.min_score or min_score,
        max_detections=options.max_detections or max_detections,
    )


def detection_cost(max_detections: int, frame: Frame) -> Cost:
    """The image decoded and at most max_detections boxes answered (mapping them is
    microseconds each)."""
    return Cost(frame.width * frame.height, 0, max_detections * DETECTION_BYTES, max_detections)


class DetectionTask(FolderTask[DetectionConfig]):
    compare = staticmethod(compare_detections)

    def resolve(
        self, options: DetectOptions, config: ModelConfig, rules: Rules
    ) -> DetectionSettings:
        return resolve_options(options, self.own(config), rules)

    plan_outputs = staticmethod(plan_outputs)

    def map(
        self,
        outputs: Mapping[str, Tensor],
        plan: OutputPlan,
        frame: Frame,
        options: DetectionSettings,
        config: ModelConfig,
    ) -> Detections:
        if plan.form == "od_api":
            return Detections(
                map_detections(
                    outputs,
                    width=frame.width,
                    height=frame.height,
                    labels=config.labels,
                    min_score=options.min_score,
                    max_detections=options.max_detections,
                    transform=frame.transform,
                )
            )
        assert isinstance(plan, DetectionPlan)
        return Detections(map_decoded(outputs, plan, frame, config.labels, options).found)

    def cost(
        self, options: DetectionSettings, frame: Frame, plan: OutputPlan, config: ModelConfig
    ) -> Cost:
        return detection_cost(options.max_detections, frame)

    finds_instances = True

    def instances(self, result: Detections) -> Sequence[Located]:
        return result.detections

    def summary(self, result: Detections) -> dict[str, object]:
        return {"detections": len(result.detections)}

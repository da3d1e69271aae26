"""The keypoints task: instances (box, class, score) with named keypoints in pixels of the
image as a viewer shows it, from a YOLOv8/11-pose raw head or OD API-style keypoint outputs
(gateway.tasks.keypoints.plans); its options' checks are detection's."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.domain import Cost, Frame, Located, OutputPlan
from gateway.models import ModelConfig
from gateway.models.limits import Rules
from gateway.tasks.base import FolderTask
from gateway.tasks.detection.nouns import DetectionSettings
from gateway.tasks.detection.task import DETECTION_BYTES, resolve_options
from gateway.tasks.keypoints.compare import compare_keypoints
from gateway.tasks.keypoints.config import KeypointConfig
from gateway.tasks.keypoints.mapping import map_keypoints
from gateway.tasks.keypoints.nouns import KeypointOptions, Keypoints
from gateway.tasks.keypoints.plans import KeypointPlan, plan_keypoints

KEYPOINT_BYTES = 60  # a named keypoint in proto JSON: name, x, y, score


class KeypointTask(FolderTask[KeypointConfig]):
    compare = staticmethod(compare_keypoints)

    def resolve(
        self, options: KeypointOptions, config: ModelConfig, rules: Rules
    ) -> DetectionSettings:
        return resolve_options(options, self.own(config).detection, rules)

    plan_outputs = staticmethod(plan_keypoints)

    map = staticmethod(map_keypoints)

    def cost(
        self, options: DetectionSettings, frame: Frame, plan: OutputPlan, config: ModelConfig
    ) -> Cost:
        """The image decoded; at most max_detections instances of the plan's keypoints
        (COCO's 17 when the signature does not say), ~60 bytes each."""
        points = plan.points if isinstance(plan, KeypointPlan) and plan.points else 17
        instances = options.max_detections
        answer = instances * (DETECTION_BYTES + points * KEYPOINT_BYTES)
        return Cost(frame.width * frame.height, 0, answer, instances * (1 + points))

    finds_instances = True

    def instances(self, result: Keypoints) -> Sequence[Located]:
        return result.instances

    def summary(self, result: Keypoints) -> dict[str, object]:
        return {"instances": len(result.instances)}

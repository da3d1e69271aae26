"""Recognising a keypoint model's output form, once per model version: the signature and the
model config -> a KeypointPlan, or BAD_MODEL naming the config key to set.

Forms:
- `yolo-pose`: a YOLOv8/11-pose raw head `[batch, 4 + classes + 3K, candidates]`: per
  candidate cx, cy, w, h in pixels of the image sent, one sigmoid score per class, then K
  keypoints as (x, y, visibility) triples, x and y in pixels of the image sent, visibility
  through a sigmoid (ultralytics/nn/modules/head.py, Pose.kpts_decode);
- `od_keypoints`: detection's outputs (any form gateway.tasks.detection.plans reads) plus
  `[batch, N, K, 2]` keypoints as normalized (y, x) of the image the model saw and `[batch,
  N, K]` scores, row for row with the boxes (the TF Object Detection API's
  `detection_keypoints` and `detection_keypoint_scores`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.domain import OutputPlan
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.base import described
from gateway.tasks.detection.plans import DetectionPlan, plan_outputs, yolo_plan
from gateway.tasks.keypoints.config import YOLO_POSE, KeypointConfig, names_and_skeleton
from gateway.upstream.signatures import Signature, TensorSpec

KEYPOINTS = "detection_keypoints"
KEYPOINT_SCORES = "detection_keypoint_scores"
OD_KEYPOINTS = "od_keypoints"
_PER_POINT = 3  # x, y, visibility


@dataclass(frozen=True)
class KeypointPlan(OutputPlan):
    """Which output is what for one model version. `points` and `classes` are 0 where the
    signature leaves them to the outputs (checked per request)."""

    detection: DetectionPlan | None = None
    head: str | None = None  # yolo-pose's raw head
    keypoints: str | None = None  # od_keypoints' outputs
    keypoint_scores: str | None = None
    points: int = 0
    classes: int = 0
    names: tuple[str, ...] | None = None  # None: COCO-17's if the outputs give 17 points
    skeleton: tuple[tuple[int, int], ...] | None = None

    def describe(self) -> dict[str, object]:
        names = "COCO-17 if 17 points" if self.names is None else ", ".join(self.names)
        if self.form == YOLO_POSE:
            assert self.detection is not None
            return {
                "form": "yolo-pose raw head [batch, 4 + classes + 3 x keypoints, candidates]",
                "head": self.head,
                "classes": self.classes or "from the head",
                "keypoints": names,
                "skeleton": len(self.skeleton or ()),
                "nms": f"class-wise, IoU {self.detection.nms_iou}, at most "
                f"{self.detection.max_candidates} candidates after min_score",
            }
        assert self.detection is not None
        return {
            **self.detection.describe(),
            "keypoints": f"{self.keypoints} (normalized y, x) and {self.keypoint_scores}",
            "keypoint_names": names,
            "skeleton": len(self.skeleton or ()),
        }


def plan_keypoints(signature: Signature, config: KeypointConfig) -> KeypointPlan:
    what, shown = described(signature)
    if config.decoder == YOLO_POSE:
        return _yolo_pose(signature, config, what, shown)
    outputs = signature.outputs
    names = {
        "keypoints": config.keypoints or KEYPOINTS,
        "keypoint_scores": config.keypoint_scores or KEYPOINT_SCORES,
    }
    for key, name in names.items():
        if name not in outputs:
            if getattr(config, key) is not None:
                raise errors.bad_model(
                    f"the model config says outputs.{key} = '{name}' but {what} has no such "
                    f"output: {shown}"
                )
            raise errors.bad_model(_unrecognised(signature, what, shown, name))
    points = _check_od(outputs[names["keypoints"]], outputs[names["keypoint_scores"]], names,
                       what)  # fmt: skip
    detection = plan_outputs(signature, config.detection)
    named = _names(config, points, what) if points else None
    return KeypointPlan(
        (*detection.output_filter, names["keypoints"], names["keypoint_scores"]),
        OD_KEYPOINTS,
        detection=detection,
        keypoints=names["keypoints"],
        keypoint_scores=names["keypoint_scores"],
        points=points,
        names=named[0] if named else config.names,
        skeleton=named[1] if named else config.skeleton,
    )


def _yolo_pose(signature: Signature, config: KeypointConfig, what: str, shown: str) -> KeypointPlan:
    outputs = signature.outputs
    if config.predictions is not None:
        if config.predictions not in outputs:
            raise errors.bad_model(
                f"the model config says outputs.predictions = '{config.predictions}' but "
                f"{what} has no such output: {shown}"
            )
        name = config.predictions
    elif len(outputs) == 1:
        (name,) = outputs
    else:
        raise errors.bad_model(
            f"the model config says outputs.decoder = '{YOLO_POSE}' but {shown}; name the "
            "raw head [batch, 4 + classes + 3 x keypoints, candidates] with outputs.predictions"
        )
    spec = outputs[name]
    if not _is_head(spec):
        raise errors.bad_model(
            f"the model config says outputs.decoder = '{YOLO_POSE}' but {what}'s output "
            f"'{name}' is {spec.describe()}; a YOLO-pose head is float [batch, 4 + classes + "
            "3 x keypoints, candidates] (an Ultralytics pose export with nms=False)"
        )
    assert spec.shape is not None
    channels = spec.shape[1]
    points = classes = 0
    if config.names is not None:
        points = len(config.names)
        if channels != -1:
            classes = channels - 4 - _PER_POINT * points
            if classes < 1:
                raise errors.bad_model(
                    f"{what}'s output '{name}' is {spec.describe()}: {channels} channels "
                    f"cannot hold 4 box values, a class score and {points} keypoints "
                    f"(outputs.keypoint_names lists {points}) of 3 values each"
                )
    elif channels != -1:
        # Without names, the head is read as Ultralytics' pose models are: one class.
        if (channels - 5) % _PER_POINT or channels < 5 + _PER_POINT:
            raise errors.bad_model(
                f"{what}'s output '{name}' is {spec.describe()}: {channels} channels are not "
                "4 box values, one class score and 3 per keypoint; set "
                "outputs.keypoint_names to the model's keypoints (the classes are the rest)"
            )
        points, classes = (channels - 5) // _PER_POINT, 1
    named = _names(config, points, what) if points else None
    return KeypointPlan(
        (name,),
        YOLO_POSE,
        detection=yolo_plan(name, config.detection.outputs),
        head=name,
        points=points,
        classes=classes,
        names=named[0] if named else config.names,
        skeleton=named[1] if named else config.skeleton,
    )


def _names(
    config: KeypointConfig, points: int, what: str
) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    named = names_and_skeleton(config.names, config.skeleton, points)
    if named is None:
        raise errors.bad_model(
            f"{what} gives {points} keypoints; COCO-17 names only 17: set "
            f"outputs.keypoint_names to its {points} names in the model's order"
        )
    if len(named[0]) != points:
        raise errors.bad_model(
            f"{what} gives {points} keypoints but outputs.keypoint_names lists {len(named[0])}"
        )
    return named


def _check_od(keypoints: TensorSpec, scores: TensorSpec, names: dict[str, str], what: str) -> int:
    """K from `[batch, N, K, 2]` keypoints and `[batch, N, K]` scores (0 if unknown)."""
    shape = keypoints.shape
    if shape is not None and (len(shape) != 4 or shape[3] not in (-1, 2)):
        raise errors.bad_model(
            f"{what}: output '{names['keypoints']}' is {keypoints.describe()}; keypoints must "
            "be [batch, N, K, 2] (normalized y, x, as the OD API writes them)"
        )
    if scores.shape is not None and len(scores.shape) != 3:
        raise errors.bad_model(
            f"{what}: output '{names['keypoint_scores']}' is {scores.describe()}; keypoint "
            "scores must be [batch, N, K]"
        )
    return max(shape[2], 0) if shape is not None else 0


def _is_head(spec: TensorSpec) -> bool:
    shape = spec.shape
    return (
        spec.dtype in (tfs.DT_FLOAT, tfs.DT_DOUBLE, tfs.DT_HALF, tfs.DT_BFLOAT16)
        and shape is not None
        and len(shape) == 3
        and (shape[1] == -1 or shape[1] >= 5 + _PER_POINT)
    )


def _unrecognised(signature: Signature, what: str, shown: str, name: str) -> str:
    outputs = signature.outputs
    if len(outputs) == 1 and _is_head(next(iter(outputs.values()))):
        return (
            f"{what} cannot be used for keypoints as it is: {shown}. If that one output is a "
            f"YOLO-pose head [batch, 4 + classes + 3 x keypoints, candidates] (YOLOv8/11-pose "
            f"exports), set outputs.decoder = '{YOLO_POSE}' in the model config"
        )
    return (
        f"{what} has no '{name}' output for keypoints: {shown}; name its outputs in the "
        f"model config: outputs.keypoints ([batch, N, K, 2], normalized y, x) and "
        f"outputs.keypoint_scores ([batch, N, K]) with the detection outputs, or "
        f"outputs.decoder = '{YOLO_POSE}' for a raw YOLO-pose head"
    )

"""The detection task: a detector's outputs -> detections in pixels of the image.

The plan is chosen once per model version from the signature and `[models.NAME.outputs]`
(`plans`):
- `od_api`: the TF Object Detection API's outputs (`detection_boxes` as normalized [ymin,
  xmin, ymax, xmax] of the image the model saw, `detection_scores`, 1-based
  `detection_classes`, `num_detections`; rows after it are padding), read per request by the
  plain-Python fast path (`od_api`);
- `boxes`: the same four roles under other names or in other forms (box format, pixel or
  Model Garden `image_info` coordinates, a class offset, no `num_detections`), through
  gateway.tasks.decoders (`forms`);
- `yolo`: a raw `[batch, 4 + classes, candidates]` head, decoded and NMS'd (`forms`).
What the signature and config cannot settle is refused at startup, naming the key to set.
`task` holds DetectionTask, which the app registers.
"""

from gateway.domain import OutputError
from gateway.tasks.detection.od_api import (
    BOXES,
    CLASSES,
    NUM_DETECTIONS,
    REQUIRED_OUTPUTS,
    SCORES,
    map_detections,
)
from gateway.tasks.detection.plans import DetectionPlan, plan_outputs
from gateway.tasks.detection.task import DetectionSettings, DetectionTask

__all__ = [
    "BOXES",
    "CLASSES",
    "NUM_DETECTIONS",
    "REQUIRED_OUTPUTS",
    "SCORES",
    "TASK",
    "DetectionPlan",
    "DetectionSettings",
    "DetectionTask",
    "OutputError",
    "map_detections",
    "plan_outputs",
]

TASK = DetectionTask()

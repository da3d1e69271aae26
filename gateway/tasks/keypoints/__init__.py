"""The keypoints task (keypoints.v1): instances with named keypoints (COCO-17 by default) in
pixels of the image as a viewer shows it, from YOLOv8/11-pose raw heads (`decoder =
"yolo-pose"`) or OD API-style `detection_keypoints` + `detection_keypoint_scores`."""

from gateway.tasks.keypoints.task import KeypointTask

__all__ = ["TASK", "KeypointTask"]

TASK = KeypointTask()

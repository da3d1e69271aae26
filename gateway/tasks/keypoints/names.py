"""Keypoint names and skeletons: COCO's 17 person keypoints (the default for a model with 17
points) and the skeleton COCO draws them with.

The names and their order are COCO 2017's `person_keypoints` category (`keypoints`), which
YOLOv8/11-pose and the TF Object Detection API's CenterNet keypoint models follow; the
skeleton is that category's `skeleton` (19 edges, 1-based in the annotation files, 0-based
here).
"""

from __future__ import annotations

COCO17 = "coco17"
COCO17_NAMES = (
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
)
_COCO17_SKELETON_1_BASED = (
    (16, 14), (14, 12), (17, 15), (15, 13), (12, 13), (6, 12), (7, 13), (6, 7), (6, 8),
    (7, 9), (8, 10), (9, 11), (2, 3), (1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7),
)  # fmt: skip
COCO17_SKELETON = tuple((a - 1, b - 1) for a, b in _COCO17_SKELETON_1_BASED)

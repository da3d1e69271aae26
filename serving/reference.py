"""The reference models this repository exports, and the classifiers' labels and palette.

TensorFlow-free (standard library only), so the gateway's dev launcher and tests can learn
which models `make models` provides, and for which task, without importing TensorFlow.
`serving.export` builds them; `serving/models.config` serves them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

Task = Literal["detection", "classification", "instance_segmentation", "keypoints", "embedding"]
DETECTION: Final = "detection"
CLASSIFICATION: Final = "classification"

# Model name -> task, in export order. Every name has a config entry in serving/models.config.
REFERENCE_MODELS: Final[dict[str, Task]] = {
    # TF Object Detection API forms (same detection function, see serving.detector).
    "detector": "detection",  # image_tensor: uint8 [1,-1,-1,3]
    "detector_encoded": "detection",  # encoded_image_string_tensor: string [-1]
    "detector_fixed": "detection",  # image_tensor with a fixed size: uint8 [1,320,320,3]
    "detector_float": "detection",  # float_image_tensor: float32 [1,-1,-1,3], 0..255
    # Hugging Face ViT forms (same classification function, see serving.classifier).
    "classifier": "classification",  # string_input: base64url images -> label, confidence
    "classifier_scores": "classification",  # input_tensor: float32 [-1,224,224,3] in [0,1]
    "classifier_logits": "classification",  # pixel_values: float32 [-1,3,224,224], normalised
    # One model for each of the other tasks, in the layout users bring (serving.segmenter,
    # serving.pose, serving.embedder).
    "maskrcnn": "instance_segmentation",  # OD API Mask R-CNN: detection_masks [1,100,33,33]
    "pose": "keypoints",  # YOLOv8-pose raw head: images [1,640,640,3] -> output_0 [1,56,100]
    "embedder": "embedding",  # Keras, include_top=False: inputs [-1,224,224,3] -> [-1,48]
}

# Class names, one per line, line i = class id i (0-based, as in a ViT's id2label).
LABELS_PATH: Final = Path(__file__).with_name("labels.txt")
LABELS_FILENAME: Final = "labels.txt"
# The keypoint model's one class (YOLOv8-pose's class 0), in the same form.
POSE_LABELS_PATH: Final = Path(__file__).with_name("pose-labels.txt")

# The classifiers' palette: the eight corners of the RGB cube, in labels.txt order.
CLASSIFIER_PALETTE: Final[dict[str, tuple[int, int, int]]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
}


def read_labels(path: Path = LABELS_PATH) -> list[str]:
    """The class names of a labels.txt file, in class-id order (blank lines are not classes)."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def models_for(task: Task) -> list[str]:
    """The reference models of one task, in export order."""
    return [name for name, model_task in REFERENCE_MODELS.items() if model_task == task]

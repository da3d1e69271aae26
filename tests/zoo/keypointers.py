"""The zoo's keypoint model (run by tests/zoo/build.py in `.venv-zoo`): a Keras model with
YOLOv8-pose's head and export layout, and its keypoints as Ultralytics' own post-processing
gives them, in pixels of the image as a viewer shows it.

Ultralytics (and so torch) cannot be installed here, so the model is built in Keras with the
exact head: detectors.yolo_model's backbone, anchor-free decoupled box (DFL) and class
branches, plus the Pose head's keypoint branch (ultralytics/nn/modules/head.py, `Pose`: one
conv per level giving 3K channels, decoded by `Pose.kpts_decode` as x = (raw_x * 2 + anchor_x
- 0.5) * stride, likewise y, visibility = sigmoid(raw)), exported as Ultralytics exports it:
`[batch, 4 + 1 + 3K, candidates]`, box cx, cy, w, h and keypoints in input pixels. The
reference is Ultralytics' post-processing reimplemented in numpy and TensorFlow
(ultralytics/utils/ops.py: `non_max_suppression`: best class per candidate over the score
threshold, the best `max_nms`, class-wise NMS (torchvision's, as tf.image.non_max_suppression
does it), `max_det`, the keypoints riding along as the candidate's extra columns; then
`scale_boxes`/`scale_coords` back to the photo and `clip_coords` to it). The model takes
320x320 stretched with tf.image.resize (bilinear), as detectors.yolo does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from build import MAX_CANDIDATES, MAX_DETECTIONS, MIN_SCORE, NMS_IOU, SEED, YOLO_SIZE, Photo, scores
from detectors import DETECTOR_PHOTOS

KEYPOINTS = 17  # COCO-17, the gateway's default names
KEYPOINTER_PHOTOS = DETECTOR_PHOTOS  # PNGs and JPEGs of several sizes, two EXIF-rotated
# The random final convs' outputs, (mean, spread) per channel: the keypoint offsets within a
# few cells of the anchor and visibility logits near +-2, as a trained head's; the class logit
# such that a fifth or so of the candidates pass MIN_SCORE (Keras' initial weights leave the
# one class's scores all near 0.5 or all near 0).
RAW = {"keypoints_": (0.0, 1.0), "classes_": (-2.0, 1.5)}


def yolo_pose_model(size: int, keypoints: int = KEYPOINTS) -> Any:
    """detectors.yolo_model's network (one class) with the Pose head's keypoint branch:
    output [batch, 4 + 1 + 3 x keypoints, candidates]."""
    import keras
    from keras import layers, ops

    reg_max = 16
    inputs = keras.Input((size, size, 3))
    x = inputs
    features = []
    for i, filters in enumerate([16, 32, 64, 96, 128]):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.Activation("silu")(x)
        if i >= 2:
            features.append(x)
    boxes, found, points = [], [], []
    for feature, stride in zip(features, (8, 16, 32), strict=True):
        cells = size // stride
        spread = keras.initializers.RandomNormal(stddev=12.0, seed=stride)
        b = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        b = layers.Conv2D(4 * reg_max, 1, kernel_initializer=spread)(b)
        c = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        c = layers.Conv2D(1, 1, name=f"classes_{stride}")(c)
        k = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        k = layers.Conv2D(3 * keypoints, 1, name=f"keypoints_{stride}")(k)
        b = ops.reshape(b, (-1, cells * cells, 4, reg_max))
        distance = ops.sum(ops.softmax(b, axis=-1) * ops.arange(reg_max, dtype="float32"), -1)
        grid_y, grid_x = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
        grid = np.stack([grid_x, grid_y], -1).reshape(1, -1, 2).astype(np.float32)
        anchors = ops.convert_to_tensor(grid + 0.5)
        top_left = ops.subtract(anchors, distance[..., :2])
        bottom_right = ops.add(anchors, distance[..., 2:])
        centre = (top_left + bottom_right) / 2 * stride
        extent = (bottom_right - top_left) * stride
        boxes.append(ops.concatenate([centre, extent], axis=-1))
        found.append(ops.sigmoid(ops.reshape(c, (-1, cells * cells, 1))))
        # Pose.kpts_decode: (raw * 2 + (anchor - 0.5)) * stride for x and y, sigmoid for the
        # visibility; the K (x, y, visibility) triples interleaved, as kpts.view(b, K, 3, n).
        raw = ops.reshape(k, (-1, cells * cells, keypoints, 3))
        xy = (raw[..., :2] * 2.0 + ops.convert_to_tensor(grid[:, :, None, :])) * stride
        visible = ops.sigmoid(raw[..., 2:])
        decoded = ops.concatenate([xy, visible], axis=-1)
        points.append(ops.reshape(decoded, (-1, cells * cells, 3 * keypoints)))
    head = ops.concatenate(
        [ops.concatenate(boxes, 1), ops.concatenate(found, 1), ops.concatenate(points, 1)],
        axis=-1,
    )
    return keras.Model(inputs, ops.transpose(head, (0, 2, 1)), name="yolo_pose")


def _spread_final_convs(model: Any, inputs: Any) -> None:
    """Rescales each level's final keypoint and class conv so that its raw outputs on
    `inputs` have RAW's mean and spread per channel: Keras' initial weights give offsets
    that throw every keypoint far outside the image (all clamped to its edges) or none off
    its anchor, and class scores that hardly vary."""
    import keras

    for layer in model.layers:
        prefix = next((p for p in RAW if layer.name.startswith(p)), None)
        if prefix is None:
            continue
        mean, wanted = RAW[prefix]
        probe = keras.Model(model.input, layer.output)
        values = np.asarray(probe(inputs)).reshape(-1, layer.filters)
        means, spread = values.mean(axis=0), float(values.std())
        kernel, bias = layer.get_weights()
        factor = wanted / spread
        layer.set_weights([(kernel * factor).astype(np.float32),
                           ((bias - means) * factor + mean).astype(np.float32)])  # fmt: skip


def yolo_pose_reference(head: np.ndarray, photo: Photo) -> dict[str, Any]:
    """Ultralytics' post-processing of one image's head [4 + 1 + 3K, candidates] (see the
    module's docstring), with the keypoints of each kept candidate scaled from the model's
    input to the photo (a stretch: x by width / size, y by height / size) and clipped to it."""
    class_scores = head[4:5]
    best = class_scores.argmax(axis=0)
    score = class_scores.max(axis=0).astype(np.float64)
    passing = np.flatnonzero(score >= MIN_SCORE)
    passing = passing[np.argsort(-score[passing], kind="stable")[:MAX_CANDIDATES]]
    cx, cy, w, h = (head[i, passing].astype(np.float64) for i in range(4))
    yxyx = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    kept: list[int] = []
    for c in np.unique(best[passing]):
        members = np.flatnonzero(best[passing] == c)
        chosen = tf.image.non_max_suppression(
            yxyx[members].astype(np.float32), score[passing][members].astype(np.float32),
            len(members), iou_threshold=NMS_IOU,
        ).numpy()  # fmt: skip
        kept.extend(members[chosen].tolist())
    kept.sort(key=lambda i: -score[passing][i])
    kept = kept[:MAX_DETECTIONS]
    x_scale, y_scale = photo.width / YOLO_SIZE, photo.height / YOLO_SIZE
    xyxy = yxyx[kept][:, [1, 0, 3, 2]] * np.array([x_scale, y_scale, x_scale, y_scale])
    triples = head[5:, passing[kept]].astype(np.float64).reshape(KEYPOINTS, 3, len(kept))
    x = np.clip(triples[:, 0].T * x_scale, 0, photo.width)  # clip_coords
    y = np.clip(triples[:, 1].T * y_scale, 0, photo.height)
    return {
        "boxes": xyxy.tolist(),
        "scores": scores(score[passing][kept]),
        "classes": [int(c) for c in best[passing][kept]],
        "keypoints": np.stack([x, y, triples[:, 2].T], axis=-1).tolist(),  # [n, K, 3]
    }


def _prepared(photo: Photo) -> np.ndarray:
    """RGB scaled to [0, 1], as Ultralytics feeds it; stretched to the input size."""
    pixels = tf.image.resize(photo.shown(), (YOLO_SIZE, YOLO_SIZE), method="bilinear")
    return pixels.numpy()[None] / 255.0


def yolo_pose(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    import keras

    keras.utils.set_random_seed(SEED)
    model = yolo_pose_model(YOLO_SIZE)
    _spread_final_convs(model, _prepared(photos[KEYPOINTER_PHOTOS[0]]))
    model.export(str(models / "yolo_v8_pose_layout" / "1"))
    results = {}
    for photo in (photos[p] for p in KEYPOINTER_PHOTOS):
        head = np.asarray(model(_prepared(photo)))[0]
        results[photo.name] = yolo_pose_reference(head, photo)
    return {"yolo_v8_pose_layout": results}


BUILDERS = {"yolo_pose": yolo_pose}

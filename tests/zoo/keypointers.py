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


# ---- The same network behind an OD API-style signature ---------------------------------------

OD_ROWS = 100  # rows of the padded outputs, as an OD API export's max_total_detections
OD_SCORE_THRESHOLD = 0.1  # the graph's own NMS threshold, under the tests' MIN_SCORE


def od_api_pose(models: Path, photos: dict[str, Photo]) -> dict[str, Any]:
    """yolo_pose's network with its decoding and NMS in the graph, exported with the TF Object
    Detection API's keypoint outputs (as its CenterNet keypoint exports give them):
    `detection_boxes` normalized [ymin, xmin, ymax, xmax] clipped to the image,
    `detection_scores`, `detection_classes` (1-based), `num_detections`,
    `detection_keypoints` [1, 100, 17, 2] normalized (y, x) clipped to the image,
    `detection_keypoint_scores` [1, 100, 17]; padded to 100 rows. The reference is the
    exported function run directly in TensorFlow."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = yolo_pose_model(YOLO_SIZE)
    _spread_final_convs(model, _prepared(photos[KEYPOINTER_PHOTOS[0]]))

    def serve(images: Any) -> dict[str, Any]:
        head = model(images)[0]  # [4 + 1 + 51, candidates]
        cx, cy, w, h = head[0], head[1], head[2] / 2, head[3] / 2
        boxes = tf.stack([cy - h, cx - w, cy + h, cx + w], axis=1) / YOLO_SIZE
        score = head[4]
        kept, count = tf.image.non_max_suppression_padded(
            boxes, score, OD_ROWS, iou_threshold=NMS_IOU,
            score_threshold=OD_SCORE_THRESHOLD, pad_to_max_output_size=True,
        )  # fmt: skip
        rows = tf.cast(tf.range(OD_ROWS) < count, tf.float32)
        picked = tf.gather(boxes, kept)
        points = tf.reshape(tf.gather(tf.transpose(head[5:]), kept), (OD_ROWS, KEYPOINTS, 3))
        yx = tf.clip_by_value(tf.stack([points[..., 1], points[..., 0]], -1) / YOLO_SIZE,
                              0.0, 1.0)  # fmt: skip
        return {
            # Clipped to the image window, as the OD API's postprocessing clips boxes.
            "detection_boxes": (tf.clip_by_value(picked, 0.0, 1.0) * rows[:, None])[None],
            "detection_scores": (tf.gather(score, kept) * rows)[None],
            "detection_classes": rows[None],
            "num_detections": tf.cast(count, tf.float32)[None],
            "detection_keypoints": (yx * rows[:, None, None])[None],
            "detection_keypoint_scores": (points[..., 2] * rows[:, None])[None],
        }

    # keras.export.ExportArchive, as detectors.keras_hub_detector exports its decoding: a
    # tf.Module would not track a Keras 3 model's variables.
    archive = keras.export.ExportArchive()
    archive.track(model)
    spec = keras.InputSpec(shape=(1, YOLO_SIZE, YOLO_SIZE, 3), dtype="float32")
    endpoint = archive.add_endpoint("serve", serve, input_signature=[spec])
    archive.write_out(str(models / "od_api_pose_layout" / "1"))
    results = {}
    for photo in (photos[p] for p in KEYPOINTER_PHOTOS):
        out = {
            k: np.asarray(v)[0] for k, v in endpoint(_prepared(photo).astype(np.float32)).items()
        }
        count = int(out["num_detections"])
        keep = out["detection_scores"][:count] >= MIN_SCORE
        size = np.array([photo.height, photo.width] * 2, dtype=np.float64)
        yxyx = out["detection_boxes"][:count][keep].astype(np.float64) * size
        yx = out["detection_keypoints"][:count][keep].astype(np.float64)
        visibility = out["detection_keypoint_scores"][:count][keep].astype(np.float64)
        results[photo.name] = {
            "boxes": yxyx[:, [1, 0, 3, 2]].tolist(),
            "scores": scores(out["detection_scores"][:count][keep]),
            "classes": [int(c) for c in out["detection_classes"][:count][keep]],
            "keypoints": np.stack(
                [yx[..., 1] * photo.width, yx[..., 0] * photo.height, visibility], axis=-1
            ).tolist(),
        }
    return {"od_api_pose_layout": results}


BUILDERS = {"yolo_pose": yolo_pose, "od_api_pose": od_api_pose}

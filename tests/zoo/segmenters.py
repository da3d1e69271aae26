"""The zoo's instance segmentation models (run in `.venv-zoo` by
tests/zoo/test_segmentation_zoo.py, which caches what it writes), each with what its library's
own post-processing gives, in pixels of the image as a viewer shows it:

- `mg_maskrcnn_image_tensor`: TF Model Garden's Mask R-CNN (`maskrcnn_resnetfpn_coco`,
  ResNet-18, 256x256, random weights) exported with export_saved_model_lib (`image_tensor`);
  the reference is the model's own outputs (boxes undone with its image_info, as
  detectors.model_garden reads them) with its masks pasted by Model Garden's
  official/vision/ops/mask_ops.py `paste_instance_masks` (the COCO evaluator's paste), as
  COCO RLE written by pycocotools;
- `yolo_v8_seg_layout`, below.

YOLOv8-seg:
Ultralytics runs on torch, which the exporters' venv has not, so the model is built in Keras
with the exact head, as keypointers.py builds the pose head: keypointers.yolo_pose_model's
backbone and DFL box and class branches, plus the Segment head's parts
(ultralytics/nn/modules/head.py, `Segment`: a mask-coefficient conv per level giving M = 32
channels, and `Proto` on the stride-8 features: conv, 2x upsampling (a transposed conv), conv,
conv to M maps at a quarter of the input), exported as Ultralytics' TensorFlow exports give
it: the head `[batch, 4 + 1 + 32, candidates]` and the prototypes channels-last `[batch, 80,
80, 32]` (the gateway reads the layout from the shape). The model takes 320x320 stretched with
tf.image.resize (bilinear), as detectors.yolo does. Its outputs on each photo are saved
(yolo/<photo>.npz: head [37, candidates], prototypes [80, 80, 32]) for the reference, which is
Ultralytics' own post-processing run by the library itself in its venv:
tests/zoo/ultralytics_masks.py.

    .venv-zoo/bin/python tests/zoo/segmenters.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

MASKS = 32


def yolo_seg_model(size: int) -> Any:
    """keypointers.yolo_pose_model's network with the Segment head's coefficient branch and
    Proto module: outputs the head [batch, 4 + 1 + 32, candidates] and the prototypes
    [batch, size / 4, size / 4, 32]."""
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
    boxes, found, coefficients = [], [], []
    for feature, stride in zip(features, (8, 16, 32), strict=True):
        cells = size // stride
        spread = keras.initializers.RandomNormal(stddev=12.0, seed=stride)
        b = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        b = layers.Conv2D(4 * reg_max, 1, kernel_initializer=spread)(b)
        c = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        c = layers.Conv2D(1, 1, name=f"classes_{stride}")(c)
        m = layers.Conv2D(64, 3, padding="same", activation="silu")(feature)
        m = layers.Conv2D(MASKS, 1, name=f"coefficients_{stride}")(m)
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
        coefficients.append(ops.reshape(m, (-1, cells * cells, MASKS)))
    head = ops.concatenate(
        [ops.concatenate(boxes, 1), ops.concatenate(found, 1), ops.concatenate(coefficients, 1)],
        axis=-1,
    )
    # Proto(c1, c_=64, c2=32): cv1 3x3, ConvTranspose2d(2, 2), cv2 3x3, cv3 1x1.
    p = layers.Conv2D(64, 3, padding="same", activation="silu")(features[0])
    p = layers.Conv2DTranspose(64, 2, strides=2)(p)
    p = layers.Conv2D(64, 3, padding="same", activation="silu")(p)
    protos = layers.Conv2D(MASKS, 1, activation="silu", name="prototypes")(p)
    return keras.Model(inputs, [ops.transpose(head, (0, 2, 1)), protos], name="yolo_seg")


def _spread(model: Any, inputs: Any) -> None:
    """Rescales the final class and coefficient convs so that on `inputs` the class logits
    sit near -2 (a fifth or so of the candidates pass MIN_SCORE) and the mask logits
    (coefficients . prototypes) spread by about 4: masks with areas in and out, as a trained
    model's, not all pixels near probability 0.5."""
    import keras

    for layer in model.layers:
        if layer.name.startswith("classes_"):
            mean, wanted = -2.0, 1.5
        elif layer.name.startswith("coefficients_"):
            mean, wanted = 0.0, 4.0 / 20.0
        else:
            continue
        probe = keras.Model(model.input, layer.output)
        values = np.asarray(probe(inputs)).reshape(-1, layer.filters)
        means, spread = values.mean(axis=0), float(values.std())
        kernel, bias = layer.get_weights()
        factor = wanted / spread
        layer.set_weights([(kernel * factor).astype(np.float32),
                           ((bias - means) * factor + mean).astype(np.float32)])  # fmt: skip


def mask_rcnn(models: Path, photos: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    import tensorflow as tf
    from build import MIN_SCORE, SEED, scores
    from official.core import exp_factory
    from official.vision.ops import mask_ops
    from official.vision.serving import detection, export_saved_model_lib
    from pycocotools import mask as coco

    tf.keras.utils.set_random_seed(SEED)
    params = exp_factory.get_exp_config("maskrcnn_resnetfpn_coco")
    params.task.model.input_size = [256, 256, 3]
    params.task.model.num_classes = 7  # class 0 is the background
    params.task.model.backbone.resnet.model_id = 18
    params.task.model.detection_generator.max_num_detections = 20
    module = detection.DetectionModule(
        params=params, batch_size=1, input_image_size=[256, 256], input_type="image_tensor",
        num_channels=3,
    )  # fmt: skip
    export_saved_model_lib.export_inference_graph(
        "image_tensor", 1, [256, 256], params, None,
        str(models / "mg_maskrcnn_image_tensor" / "1"), export_module=module,
    )  # fmt: skip
    results = {}
    for name in names:
        photo = photos[name]
        out = module.serve(tf.constant(photo.shown()[None]))
        count = int(out["num_detections"][0])
        info = out["image_info"][0].numpy()
        scale = np.array([info[2][0], info[2][1], info[2][0], info[2][1]])
        offset = np.array([info[3][0], info[3][1], info[3][0], info[3][1]])
        yxyx = (out["detection_boxes"][0][:count].numpy().astype(np.float64) + offset) / scale
        found = out["detection_scores"][0][:count].numpy()
        keep = np.flatnonzero(found >= MIN_SCORE)
        xywh = np.stack([yxyx[keep, 1], yxyx[keep, 0], yxyx[keep, 3] - yxyx[keep, 1],
                         yxyx[keep, 2] - yxyx[keep, 0]], axis=1)  # fmt: skip
        grids = out["detection_masks"][0][:count].numpy()[keep]
        pasted = mask_ops.paste_instance_masks(grids, xywh, photo.height, photo.width)
        results[name] = {
            "boxes": yxyx[keep][:, [1, 0, 3, 2]].tolist(),
            "scores": scores(found[keep]),
            "classes": [int(c) for c in out["detection_classes"][0][:count].numpy()[keep]],
            "masks": [coco.encode(np.asfortranarray(m.astype(np.uint8)))["counts"].decode()
                      for m in pasted],
            "areas": [int(m.sum()) for m in pasted],
        }  # fmt: skip
    return {"mg_maskrcnn_image_tensor": results}


def build(out: Path) -> dict[str, Any]:
    import keras
    import tensorflow as tf
    from build import MAX_CANDIDATES, MAX_DETECTIONS, MIN_SCORE, NMS_IOU, SEED, YOLO_SIZE, images
    from keypointers import KEYPOINTER_PHOTOS

    def prepared(photo: Any) -> np.ndarray:
        pixels = tf.image.resize(photo.shown(), (YOLO_SIZE, YOLO_SIZE), method="bilinear")
        return pixels.numpy()[None] / 255.0

    photos = images(out)
    keras.utils.set_random_seed(SEED)
    model = yolo_seg_model(YOLO_SIZE)
    _spread(model, prepared(photos[KEYPOINTER_PHOTOS[0]]))
    model.export(str(out / "models" / "yolo_v8_seg_layout" / "1"))
    saved = out / "yolo"
    saved.mkdir(exist_ok=True)
    results = {}
    for name in KEYPOINTER_PHOTOS:
        head, protos = (np.asarray(t)[0] for t in model(prepared(photos[name])))
        np.savez(saved / f"{name}.npz", head=head, protos=protos)
        results[name] = {"outputs": f"yolo/{name}.npz"}
    expected: dict[str, Any] = {"yolo_v8_seg_layout": results}
    expected.update(mask_rcnn(out / "models", photos, KEYPOINTER_PHOTOS))
    document = {
        "settings": {"size": YOLO_SIZE, "min_score": MIN_SCORE, "nms_iou": NMS_IOU,
                     "max_detections": MAX_DETECTIONS, "max_candidates": MAX_CANDIDATES},
        "images": {p.name: {"file": p.path.name, "width": p.width, "height": p.height}
                   for p in photos.values()},
        "expected": expected,
    }  # fmt: skip
    (out / "expected.json").write_text(json.dumps(document))
    return document


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    build(Path(sys.argv[1]))

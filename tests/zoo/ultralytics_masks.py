"""Ultralytics' own post-processing of the zoo's YOLOv8-seg-layout outputs, run with the
library itself (in `.venv-ultralytics`: `make ultralytics-venv`, torch CPU and the pinned
ultralytics of constraints-ultralytics.txt) on the head and prototypes tests/zoo/segmenters.py
saved for each photo, in both of the predictor's ways
(ultralytics/models/yolo/segment/predict.py, SegmentationPredictor.construct_result):

- `native` (`retina_masks=True`): `ops.scale_boxes` to the photo, then
  `ops.process_mask_native` (coefficients . prototypes, `scale_masks` to the photo, > 0,
  `crop_mask` with the photo's boxes);
- `input` (`retina_masks=False`, the predictor's default): `ops.process_mask(...,
  upsample=True)` at the network input's size (upsampled, > 0, cropped with the input's
  boxes), then shown on the photo as ultralytics/utils/plotting.py's Annotator.masks does:
  `ops.scale_masks(masks.float(), photo) > 0.5`.

The boxes come from `ultralytics.utils.nms.non_max_suppression` (one class). Flat regions of
the synthetic photos give some candidates exactly equal scores; torch's argsort orders such
ties as it will, the gateway (as TensorFlow's NMS) by candidate order, so before the NMS each
later candidate of a tie is made one float32 step lower (`untied`): both then keep the same
instances, and the masks, which are compared, are Ultralytics' own. The model takes
the photo stretched to 320x320 (as the gateway sends it with `resize_filter =
"tf-bilinear"`), not letterboxed with centred padding as Ultralytics' predictor would: the
scaling functions get that geometry as their `ratio_pad` (gains H/320 and W/320, no padding).
For the square photo, where stretching and letterboxing are the same, the functions run
exactly as the predictor calls them, and the stretched path is checked to give the same
masks, so the geometry passed is the library's own.

    .venv-ultralytics/bin/python tests/zoo/ultralytics_masks.py ZOO_DIR

Reads ZOO_DIR/expected.json (the `yolo_v8_seg_layout` photos and their saved outputs) and
writes ZOO_DIR/ultralytics/<photo>.npz (boxes xyxy in the photo's pixels, scores, classes, and
the `native` and `input` masks [n, height, width] as bools) and ZOO_DIR/ultralytics/done.json
(the versions used).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "yolo_v8_seg_layout"


def untied(head: np.ndarray) -> tuple[np.ndarray, int]:
    """The head [4 + 1 + M, n] with its one class's equal scores made strictly decreasing in
    candidate order (a float32 step each), and how many were changed."""
    scores = head[4].astype(np.float32)
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    changed = 0
    for k in range(1, len(ranked)):
        if ranked[k] >= ranked[k - 1]:
            ranked[k] = np.nextafter(ranked[k - 1], np.float32(-1.0))
            changed += 1
    out = head.astype(np.float32)
    out[4, order] = ranked
    return out, changed


def masks_of(
    ops: Any, torch: Any, kept: Any, protos: Any, size: int, shape: tuple[int, int]
) -> dict[str, Any]:
    """The photo's boxes and both modes' masks for NMS's rows `kept` [n, 6 + M] (x1, y1, x2,
    y2 in input pixels, score, class, coefficients)."""
    height, width = shape
    square = height == width
    # The stretch as scale_boxes / scale_masks take it: ((gain_h, gain_w), (pad_w, pad_h)).
    stretch = ((size / height, size / width), (0.0, 0.0))
    coefficients = kept[:, 6:]
    m, ph, pw = protos.shape
    if square:
        boxes = ops.scale_boxes((size, size), kept[:, :4].clone(), shape)
        native = ops.process_mask_native(protos, coefficients, boxes, shape)
    else:
        boxes = ops.scale_boxes((size, size), kept[:, :4].clone(), shape, ratio_pad=stretch,
                                padding=False)  # fmt: skip
    # process_mask_native's steps with the stretch's geometry (no padding to crop: its
    # intermediate upsampling factor is 1).
    logits = (coefficients @ protos.float().view(m, -1)).view(1, -1, ph, pw)
    upsampled = ops.scale_masks(logits, shape, ratio_pad=((ph / height, pw / width), (0, 0)),
                                padding=False)[0]  # fmt: skip
    stretched_native = ops.crop_mask(upsampled.gt(0.0).byte(), boxes)
    if square:
        assert torch.equal(native, stretched_native), "the stretched path is not the library's"
    else:
        native = stretched_native
    at_input = ops.process_mask(protos, coefficients, kept[:, :4].clone(), (size, size),
                                upsample=True)  # fmt: skip
    shown = ops.scale_masks(at_input[None].float(), shape, ratio_pad=stretch, padding=False)[0]
    if square:
        predictor = ops.scale_masks(at_input[None].float(), shape)[0]
        assert torch.equal(shown, predictor), "the stretched path is not the library's"
    return {
        "boxes": boxes.numpy().astype(np.float64),
        "scores": kept[:, 4].numpy().astype(np.float64),
        "classes": kept[:, 5].numpy().astype(np.int64),
        "native": native.numpy() > 0,
        "input": shown.numpy() > 0.5,
    }


def main(zoo: Path) -> None:
    os.environ["YOLO_CONFIG_DIR"] = str(zoo / "ultralytics")  # settings not in the home dir
    os.environ["YOLO_OFFLINE"] = "True"
    import torch
    import ultralytics
    from ultralytics.utils import ops
    from ultralytics.utils.nms import non_max_suppression

    document = json.loads((zoo / "expected.json").read_text())
    settings = document["settings"]
    out = zoo / "ultralytics"
    out.mkdir(exist_ok=True)
    empty = ties = 0
    for photo, entry in document["expected"][MODEL].items():
        saved = np.load(zoo / entry["outputs"])
        strict, changed = untied(saved["head"])
        ties += changed
        head = torch.from_numpy(strict)[None]  # [1, 4 + 1 + M, n]
        protos = torch.from_numpy(saved["protos"].astype(np.float32)).permute(2, 0, 1)
        (kept,) = non_max_suppression(
            head, conf_thres=settings["min_score"], iou_thres=settings["nms_iou"],
            max_det=settings["max_detections"], nc=1, max_nms=settings["max_candidates"],
        )  # fmt: skip
        size = document["images"][photo]
        found = masks_of(ops, torch, kept, protos, settings["size"], (size["height"],
                                                                      size["width"]))  # fmt: skip
        # SegmentationPredictor.construct_result drops the instances whose mask is empty; the
        # gateway keeps them (docs/models.md): the comparison wants none here.
        empty += int(sum(not m.any() for mode in ("native", "input") for m in found[mode]))
        np.savez_compressed(out / f"{photo}.npz", **found)
    versions = {"ultralytics": ultralytics.__version__, "torch": torch.__version__,
                "empty_masks": empty, "ties_ordered": ties}  # fmt: skip
    (out / "done.json").write_text(json.dumps(versions))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

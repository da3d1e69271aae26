"""The masks of a YOLOv8/11-seg raw head: `[4 + classes + M, candidates]` per image and its
prototypes, M maps over the image the model received at a fraction of its size (a quarter:
Ultralytics' Proto module upsamples the stride-8 features once).

After the box (cx, cy, w, h) and the class scores, each candidate has M mask coefficients;
its mask is coefficients . prototypes (logits) upsampled bilinearly to the image, kept inside
its box, where sigmoid(logit) > the threshold (ultralytics/utils/ops.py, process_mask_native:
`masks_in @ protos.view(c, -1)`, `scale_masks` (bilinear `F.interpolate(...,
align_corners=False)`), `crop_mask` keeping pixel indices x1 <= r < x2, `gt_(0.0)`). The
box and class rows decode as detection's YOLO head (gateway.tasks.decoders.yolo); the
candidates kept there pick their coefficients here.
"""

from __future__ import annotations

import numpy as np

NCHW = "NCHW"
NHWC = "NHWC"


def prototype_layout(shape: tuple[int, ...], sent: tuple[int, int]) -> str:
    """NCHW or NHWC for prototypes of `shape` [1, a, b, c] over an image sent of `sent`
    (width, height): the layout whose maps have the image's aspect (both: NCHW, Ultralytics'
    own). ValueError when neither has."""
    if len(shape) != 4:
        raise ValueError(f"prototypes have shape {list(shape)}; expected rank 4")
    width, height = sent

    def fits(h: int, w: int) -> bool:
        if h < 1 or w < 1:
            return False
        ratio_h, ratio_w = height / h, width / w
        return abs(ratio_h - ratio_w) <= 0.1 * max(ratio_h, ratio_w)

    if fits(shape[2], shape[3]):
        return NCHW
    if fits(shape[1], shape[2]):
        return NHWC
    raise ValueError(
        f"prototypes {list(shape)} have the aspect of no {width}x{height} image in either "
        "layout ([1, M, h, w] or [1, h, w, M])"
    )


def split_head(head: np.ndarray, masks: int) -> tuple[np.ndarray, np.ndarray]:
    """[4 + classes + M, candidates] -> the box and class rows and the M coefficient rows.
    ValueError when the rows cannot hold a class besides M coefficients."""
    if head.ndim != 2 or masks < 1 or head.shape[0] < 5 + masks:
        raise ValueError(
            f"{list(head.shape)} cannot hold 4 box values, a class score and {masks} mask "
            "coefficients"
        )
    split = head.shape[0] - masks
    return head[:split], head[split:]


def mask_logits(coefficients: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """[n, h, w] mask logits from [M, n] coefficients and [M, h, w] prototypes (a pixel is
    in the mask where sigmoid(logit) > threshold; Ultralytics upsamples the logits and keeps
    those > 0: process_mask_native)."""
    m, h, w = prototypes.shape
    logits = coefficients.T.astype(np.float32) @ prototypes.reshape(m, h * w).astype(np.float32)
    return logits.reshape(-1, h, w)

"""The zoo's keras-hub detector's other answers (tests/zoo/detectors.py, run by build.py in
`.venv-zoo`): keras-hub's own traced NMS on the detector's candidates, in every order of
scores tied within float32 rounding that changes what it keeps.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import tensorflow as tf

# keras-hub's NonMaxSuppression, traced (as its export runs it), keeps or drops a box by its
# rank among the candidates: it gathers each tile of 512 ranks at int32(linspace(start, end,
# 512)), and TensorFlow's float32 linspace puts 48 of them (65, 69, ...) on the rank before,
# whose box then suppresses its own copy (keras-hub 0.32.0; eagerly the indices are exact).
# So candidates whose scores differ by float32 rounding of the preprocessing (the gateway's
# (x / 255 - mean) / std moves them by ~1e-6 from the converter's x * scale + offset) can
# change which boxes come out. Scores within TIE of each other (or of the threshold) have no
# order the library fixes: the reference holds the export's answer for each order of them.
TIE = 1e-5
MAX_ORDERS = 720


def tie_orders(detector: Any, images: Any) -> list[list[np.ndarray]]:
    """The detector's distinct answers ([boxes, confidence, labels]) from keras-hub's own
    traced non_max_suppression on its candidates: first in their own order, then in the other
    orders of the scores within TIE of each other (TIE) that change the answer, alone or
    together."""
    from keras_hub.src.layers.modeling import non_max_supression as module

    nms = module.non_max_suppression
    seen: dict[str, Any] = {}

    def spy(boxes: Any, confidence: Any, **options: Any) -> Any:
        seen.update(boxes=np.asarray(boxes)[0], confidence=np.asarray(confidence)[0], **options)
        return nms(boxes, confidence, **options)

    module.non_max_suppression = spy
    try:
        raw = detector(images, training=False)
        detector.decode_predictions(raw, images)
    finally:
        module.non_max_suppression = nms
    boxes, confidence = seen.pop("boxes"), seen.pop("confidence")
    labels = np.argmax(np.asarray(raw["cls_logits"])[0], axis=-1)
    traced = tf.function(lambda c: nms(tf.constant(boxes[None]), c, **seen))
    threshold = seen["score_threshold"]  # a candidate needs a confidence above it
    value = {int(i): confidence[i] for i in np.flatnonzero(confidence > threshold - TIE)}
    value[-1] = np.float32(threshold)  # -1: the threshold, as a candidate ranked among them
    ranked = sorted(value, key=lambda i: -value[i])
    groups = [[ranked[0]]]
    for i in ranked[1:]:
        if value[groups[-1][-1]] - value[i] <= TIE:
            groups[-1].append(i)
        else:
            groups.append([i])

    def kept(orders: Any) -> tuple[int, ...]:
        trial = confidence.copy()
        for order in orders:
            # Falling by one float32 step from the group's top (above the threshold when it
            # is in the group); the members after the threshold are out.
            top = max(value[i] for i in order)
            step = np.spacing(top)
            if -1 in order:
                top = max(top, np.float32(threshold) + np.float32(len(order)) * step)
            out, k = False, 0
            for i in order:
                if i < 0:
                    out = True
                    continue
                trial[i] = 0.0 if out else top - np.float32(k) * step
                k += 1
        index, valid = (np.asarray(t)[0] for t in traced(tf.constant(trial[None])))
        return tuple(int(i) for i in index[: int(valid)])

    own = kept(())
    changing = [
        g for g in groups
        if len(g) > 1 and any(set(kept([o])) != set(own) for o in itertools.permutations(g))
    ]  # fmt: skip
    assert math.prod(math.factorial(len(g)) for g in changing) <= MAX_ORDERS, changing
    answers = [own]
    for orders in itertools.product(*(itertools.permutations(g) for g in changing)):
        found = kept(orders)
        if all(set(found) != set(a) for a in answers):
            answers.append(found)
    return [[boxes[list(a)], confidence[list(a)], labels[list(a)]] for a in answers]

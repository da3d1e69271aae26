"""max_side through the whole path: a gateway with the example model config (`scaled_stub`,
conftest.py) sends big photos to TF Serving at the size the model needs, the boxes within 1 px
at that scale, and an image within it as it is."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfswire
from serving import scenes
from tests.support.detections import MODELS, assert_matches, detect, model, scene_for, sent_size

# --- max_side: big photos are sent at the size the model needs ---------------------------


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("seed", "width", "height", "fmt"),
    [
        (110, 4032, 3024, "JPEG"),  # 12 MP: DCT-scaled decode (1/2), then resized to 1024x768
        (111, 2048, 1536, "JPEG"),  # exactly 1/2: the DCT-scaled decode alone
        (112, 1500, 1000, "PNG"),  # no DCT scaling: resized only, to 1024x683
        (113, 3024, 4032, "JPEG"),  # portrait
    ],
)
def test_max_side_sends_the_scaled_image_and_boxes_stay_within_1px_at_the_sent_scale(
    scaled_stub, recording, name, seed, width, height, fmt
):
    longest = max(width, height)
    scale = 1024 / longest
    # Rectangles at least ~12 px and 4 px apart once scaled down.
    rng = np.random.default_rng(seed)
    scene = scenes.generate_scene(
        rng, width, height, 8, noise_sigma=4.0, min_side=round(12 / scale),
        max_side=longest // 4, gap=round(4 / scale),
    )  # fmt: skip
    data = scenes.encode(scene.pixels, fmt, quality=92)
    before = len(recording.predicts)
    result = detect(scaled_stub, data, model=model(name), timeout=120)
    [sent] = recording.predicts[before:]
    sent_w, sent_h = sent_size(sent)
    assert (sent_w, sent_h) == (round(width * scale), round(height * scale))
    if name == "detector_encoded":
        assert len(sent) < len(data) / 2  # a JPEG of the scaled image, not the original
    assert (result.image_width, result.image_height) == (width, height)
    # At the scale the model saw: truth scaled down, the model's (normalised) box scaled up.
    unmatched = list(result.detections)
    for truth in scene.boxes:
        want = (
            truth.x_min * sent_w / width, truth.y_min * sent_h / height,
            truth.x_max * sent_w / width, truth.y_max * sent_h / height,
        )  # fmt: skip

        def at_sent_scale(d: pb.Detection) -> tuple[float, float, float, float]:
            n = d.normalized_box
            return n.x_min * sent_w, n.y_min * sent_h, n.x_max * sent_w, n.y_max * sent_h

        match = next(
            (
                d
                for d in unmatched
                if d.class_id == truth.class_id
                and max(abs(a - b) for a, b in zip(at_sent_scale(d), want, strict=True)) <= 1.0
            ),
            None,
        )
        assert match is not None, f"{truth} (sent scale {want}) not found in {result.detections}"
        unmatched.remove(match)
    assert [d for d in unmatched if d.score >= 0.5] == []


@pytest.mark.parametrize("name", MODELS)
def test_max_side_leaves_an_image_within_it_as_it_is(scaled_stub, recording, name):
    scene = scene_for(114, 1000, 700, 6)
    data = scenes.encode(scene.pixels, "JPEG")
    before = len(recording.predicts)
    assert_matches(detect(scaled_stub, data, model=model(name)), scene)
    [sent] = recording.predicts[before:]
    assert sent_size(sent) == (1000, 700)
    if name == "detector_encoded":
        (tensor,) = tfswire.PredictRequest.FromString(sent).inputs.values()
        assert tensor.string_val == [data]  # the caller's bytes, untouched

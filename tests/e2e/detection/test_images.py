"""Images through the whole path (gateway and TF Serving of conftest.py): generated scenes give
the exact boxes and labels, whatever the format, colour mode, EXIF orientation or JPEG encoding;
min_score, max_detections and the model version or label a request picks."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from gateway.proto.vision.v1 import model_pb2
from serving import scenes
from tests.support.detections import MODELS, assert_matches, detect, encode, model, scene_for


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("seed", "width", "height", "rects", "fmt"),
    [
        (1, 640, 480, 8, "PNG"),
        (2, 640, 480, 8, "JPEG"),
        (3, 97, 211, 2, "PNG"),
        (4, 1500, 900, 12, "JPEG"),
        (5, 300, 300, 0, "PNG"),
    ],
)
def test_generated_scenes_give_exact_boxes_and_labels(stub, name, seed, width, height, rects, fmt):
    scene = scene_for(seed, width, height, rects)
    result = detect(stub, scenes.encode(scene.pixels, fmt), model=model(name))
    assert_matches(result, scene)
    assert result.model.name == name
    assert result.request_id


# Inverse of the transposition ImageOps.exif_transpose applies for each orientation.
_UNDO = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_rotated_jpeg_boxes_are_in_the_displayed_image(stub, name, orientation):
    scene = scene_for(10 + orientation, 400, 260, 5, noise=0)
    shown = Image.fromarray(scene.pixels)
    undo = _UNDO[orientation]
    stored = shown if undo is None else shown.transpose(undo)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(stored, "JPEG", quality=95, exif=exif.tobytes())
    # The file really is shown as the scene by a viewer that honours EXIF.
    from PIL import ImageOps

    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == shown.size
    assert_matches(detect(stub, data, model=model(name)), scene)


def _variants(scene: scenes.Scene) -> dict[str, bytes]:
    rgb = Image.fromarray(scene.pixels)
    rgba = rgb.convert("RGBA")
    rgba.putalpha(200)
    return {
        "png_rgba": encode(rgba, "PNG"),
        "png_palette": encode(rgb.quantize(colors=16, method=Image.Quantize.MEDIANCUT), "PNG"),
        "gif": encode(rgb.quantize(colors=16, method=Image.Quantize.MEDIANCUT), "GIF"),
        "jpeg_cmyk": encode(rgb.convert("CMYK"), "JPEG", quality=95),
        "bmp": encode(rgb, "BMP"),
        "webp_lossless": encode(rgb, "WEBP", lossless=True),
        "tiff": encode(rgb, "TIFF"),
    }


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    "variant", ["png_rgba", "png_palette", "gif", "jpeg_cmyk", "bmp", "webp_lossless", "tiff"]
)
def test_formats_and_colour_modes_are_converted_to_rgb(stub, name, variant):
    scene = scene_for(30, 320, 240, 5, noise=0)
    assert_matches(detect(stub, _variants(scene)[variant], model=model(name)), scene)


# JPEG encodings the gateway's libjpeg-turbo path must decode as Pillow did (the exact boxes
# are the check); CMYK takes Pillow's path and is covered above.
_ODD_JPEGS = {
    "subsampling_420": {"quality": 92, "subsampling": 2},
    "subsampling_444": {"quality": 92, "subsampling": 0},
    "progressive": {"quality": 92, "progressive": True},
    "restart_markers": {"quality": 92, "restart_marker_blocks": 4},
    "rgb_without_ycbcr": {"quality": 92, "keep_rgb": True, "subsampling": 0},
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("variant", _ODD_JPEGS)
def test_odd_jpeg_encodings_give_the_exact_boxes(stub, name, variant):
    scene = scene_for(40, 333, 251, 5)
    data = encode(Image.fromarray(scene.pixels), "JPEG", **_ODD_JPEGS[variant])
    assert_matches(detect(stub, data, model=model(name)), scene)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_grayscale_image_is_accepted_and_has_no_coloured_boxes(stub, name, fmt):
    scene = scene_for(31, 320, 240, 5, noise=0)
    gray = encode(Image.fromarray(scene.pixels).convert("L"), fmt)
    result = detect(stub, gray, model=model(name), min_score=0.01)
    assert (result.image_width, result.image_height) == (320, 240)
    assert [d for d in result.detections if d.score >= 0.5] == []


def test_min_score_and_max_detections(stub):
    scene = scene_for(40, 640, 480, 10, noise=10)
    data = scenes.encode(scene.pixels, "JPEG")
    everything = detect(stub, data, min_score=0.01, max_detections=100)
    assert len(everything.detections) >= len(scene.boxes)
    top3 = detect(stub, data, min_score=0.01, max_detections=3)
    assert list(top3.detections) == list(everything.detections[:3])
    cut = everything.detections[len(scene.boxes) // 2].score
    above = detect(stub, data, min_score=float(cut), max_detections=100)
    assert all(d.score >= cut for d in above.detections)
    assert len(above.detections) == sum(d.score >= cut for d in everything.detections)


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (model_pb2.ModelSpec(name="detector"), 2),
        (model_pb2.ModelSpec(), 2),  # the gateway's default model, latest version
        (model_pb2.ModelSpec(name="detector", version=1), 1),
        (model_pb2.ModelSpec(name="detector", version=2), 2),
        (model_pb2.ModelSpec(name="detector", label="stable"), 1),
        (model_pb2.ModelSpec(name="detector", label="canary"), 2),
    ],
)
def test_version_and_label_select_the_served_version(stub, spec, version):
    scene = scene_for(50)
    result = detect(stub, scenes.encode(scene.pixels, "PNG"), model=spec)
    assert (result.model.name, result.model.version) == ("detector", version)
    assert_matches(result, scene)

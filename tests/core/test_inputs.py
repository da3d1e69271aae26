"""Input plans read from signatures and the model config; requests built for each form."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import simplejpeg
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import predict_pb2

from gateway.core.inputs import InputMode, InputPlan, build_input
from gateway.core.plans import plan_input
from gateway.errors import GatewayError, Kind
from gateway.imaging.header import ImageLimits
from gateway.models import InputPrep
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.signatures import Signature, TensorSpec

LIMITS = ImageLimits(32 << 20, 50_000_000)


def sig(dtype: int, shape: tuple[int, ...] | None, key: str = "x") -> Signature:
    return Signature("m", 1, {key: TensorSpec(dtype, shape)}, {})


def jpeg(width: int, height: int) -> bytes:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def parsed(request: bytes) -> dict[str, np.ndarray]:
    message = predict_pb2.PredictRequest.FromString(request)
    return {k: tf.make_ndarray(v) for k, v in message.inputs.items()}


@pytest.mark.parametrize(
    ("shape", "layout", "size"),
    [
        ((1, -1, -1, 3), "NHWC", None),
        ((-1, 224, 224, 3), "NHWC", (224, 224)),
        ((-1, 3, 224, 224), "NCHW", (224, 224)),
        ((1, 320, 256, 3), "NHWC", (256, 320)),
    ],
)
def test_layout_and_fixed_size_come_from_the_signature(shape, layout, size):
    plan = plan_input(sig(tfs.DT_FLOAT, shape), InputPrep())
    assert (plan.mode, plan.layout, plan.size) == (InputMode.FLOAT_PIXELS, layout, size)


def test_the_config_supplies_what_the_signature_leaves_open():
    plan = plan_input(
        sig(tfs.DT_UINT8, (1, -1, -1, 3)), InputPrep(resize=(300, 400), max_side=None)
    )
    assert plan.size == (400, 300)
    plan = plan_input(
        sig(tfs.DT_STRING, (-1,)), InputPrep(max_side=512, string_encoding="base64url")
    )
    assert (plan.mode, plan.max_side, plan.base64url) == (InputMode.ENCODED, 512, True)


@pytest.mark.parametrize(
    ("signature", "prep", "message"),
    [
        (sig(tfs.DT_INT32, (1, -1, -1, 3)), InputPrep(), "cannot be used by the gateway"),
        (sig(tfs.DT_FLOAT, (1, -1, -1, 4)), InputPrep(), "not one RGB image"),
        (sig(tfs.DT_FLOAT, (8, 224, 224, 3)), InputPrep(), "not one RGB image"),
        (sig(tfs.DT_UINT8, (1, -1, -1, 3)), InputPrep(scale=0.5), "need a float32 input"),
        (sig(tfs.DT_FLOAT, (1, 224, 224, 3)), InputPrep(resize=(100, 100)), "input.resize"),
        (sig(tfs.DT_FLOAT, (1, 224, -1, 3)), InputPrep(), "fixes only one side"),
        (sig(tfs.DT_FLOAT, (1, 224, 224, 3)), InputPrep(dtype="uint8"), "input.dtype = 'uint8'"),
        (sig(tfs.DT_STRING, (-1,)), InputPrep(mean=(1, 1, 1)), "takes encoded images"),
        (
            sig(tfs.DT_STRING, (-1,)),
            InputPrep(resize_filter="tf-bilinear"),
            "input.resize_filter is for models that take pixels",
        ),
        (
            sig(tfs.DT_UINT8, (1, -1, -1, 3)),
            InputPrep(resize_filter="nearest"),
            "input.resize_filter has nothing to resize",
        ),
    ],
)
def test_signatures_the_config_cannot_fit_are_a_bad_model(signature, prep, message):
    with pytest.raises(GatewayError) as info:
        plan_input(signature, prep)
    assert info.value.kind is Kind.BAD_MODEL and message in info.value.message


def test_a_large_jpeg_is_scaled_to_the_fixed_size_and_normalised_nchw():
    plan = InputPlan(
        "px", InputMode.FLOAT_PIXELS, "NCHW", (224, 224), None, 1 / 255, (0.5,) * 3, (0.5,) * 3
    )
    built = build_input(jpeg(2000, 1500), plan, b"", LIMITS)
    (values,) = parsed(built.request).values()
    assert values.shape == (1, 3, 224, 224) and values.dtype == np.float32
    assert values.min() >= -1.0 and values.max() <= 1.0
    assert (built.width, built.height) == (2000, 1500)


def test_max_side_keeps_the_aspect_ratio_and_boxes_stay_normalised():
    plan = InputPlan("px", InputMode.PIXELS, max_side=1000)
    built = build_input(jpeg(4000, 3000), plan, b"", LIMITS)
    (values,) = parsed(built.request).values()
    assert values.shape == (1, 750, 1000, 3)
    assert (built.width, built.height, built.transform) == (4000, 3000, None)


def test_a_string_model_gets_a_smaller_jpeg_over_max_side_and_the_original_under_it():
    big, small = jpeg(3000, 2000), jpeg(800, 600)
    plan = InputPlan("s", InputMode.ENCODED, max_side=1024)
    (sent,) = parsed(build_input(big, plan, b"", LIMITS).request)["s"]
    assert len(sent) < len(big) / 3
    assert Image.open(io.BytesIO(sent)).size == (1024, 683)
    # Chroma at half resolution, as cameras save photos (simplejpeg's default is 4:4:4).
    assert simplejpeg.decode_jpeg_header(sent)[3] == "420"
    (sent,) = parsed(build_input(small, plan, b"", LIMITS).request)["s"]
    assert sent == small
    b64 = InputPlan("s", InputMode.ENCODED, base64url=True)
    (sent,) = parsed(build_input(small, b64, b"", LIMITS).request)["s"]
    assert base64.urlsafe_b64decode(sent) == small


def test_tf_example_wraps_the_image_under_its_key_as_tensorflow_parses_it():
    small = jpeg(64, 48)
    plan = plan_input(
        sig(tfs.DT_STRING, (1,), "inputs"),
        InputPrep(string_encoding="tf_example", tf_example_key="image/encoded"),
    )
    built = build_input(small, plan, b"", LIMITS)
    (serialized,) = parsed(built.request)["inputs"]
    features = tf.io.parse_single_example(
        serialized, {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    )
    assert features["image/encoded"].numpy() == small
    assert built.sent == (64, 48)


def test_bgr_reverses_the_channels_before_the_mean_of_the_models_order():
    pixels = np.zeros((4, 6, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 200, 100, 50
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    prep = InputPrep(channel_order="BGR", mean=(10.0, 20.0, 30.0), dtype="float32")
    plan = plan_input(sig(tfs.DT_FLOAT, (-1, 4, 6, 3)), prep)
    assert not plan.plain_pixels and plan.describe()["channel_order"] == "BGR"
    (values,) = parsed(build_input(png.getvalue(), plan, b"", LIMITS).request).values()
    assert values[0, 0, 0].tolist() == [40.0, 80.0, 170.0]


def test_several_inputs_need_input_name():
    two = Signature(
        "m",
        1,
        {"a": TensorSpec(tfs.DT_UINT8, (1, -1, -1, 3)), "b": TensorSpec(tfs.DT_INT32, ())},
        {},
    )
    with pytest.raises(GatewayError, match=r"set input\.name"):
        plan_input(two, InputPrep())
    assert plan_input(two, InputPrep(name="a")).key == "a"
    with pytest.raises(GatewayError, match=r"input\.name = 'c'"):
        plan_input(two, InputPrep(name="c"))


def test_check_models_shows_which_resizing_a_model_gets():
    fixed = sig(tfs.DT_FLOAT, (-1, 224, 224, 3))
    exact = plan_input(fixed, InputPrep(resize_filter="pillow-bicubic")).describe()
    assert exact["resize_filter"] == "pillow-bicubic (exact: full decode, Pillow's BICUBIC)"
    assert plan_input(fixed, InputPrep()).describe()["resize_filter"].startswith("fast (")
    within = plan_input(sig(tfs.DT_UINT8, (1, -1, -1, 3)), InputPrep(max_side=512))
    assert within.describe()["resize_filter"].startswith("fast (")
    as_is = plan_input(sig(tfs.DT_UINT8, (1, -1, -1, 3)), InputPrep()).describe()
    assert "resize_filter" not in as_is


@pytest.mark.parametrize(("dtype", "layout"), [(tfs.DT_FLOAT, "NCHW"), (tfs.DT_UINT8, "NHWC")])
def test_a_tf_filter_sends_tf_image_resize_values(dtype, layout):
    """float32 inputs get tf.image.resize's values (then scale, mean and std); uint8 inputs
    the same values rounded."""
    data = jpeg(900, 700)
    shape = (1, 3, 160, 200) if layout == "NCHW" else (1, 160, 200, 3)
    normalise = {"scale": 1 / 255, "mean": (0.5,) * 3, "std": (0.2,) * 3}
    prep = InputPrep(resize_filter="tf-bilinear", **(normalise if dtype == tfs.DT_FLOAT else {}))
    plan = plan_input(sig(dtype, shape), prep)
    (values,) = parsed(build_input(data, plan, b"", LIMITS).request).values()
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    want = tf.image.resize(decoded, (160, 200), method="bilinear").numpy()
    if dtype == tfs.DT_FLOAT:
        want = (want * np.float32(1 / 255) - np.float32(0.5)) / np.float32(0.2)
        np.testing.assert_allclose(values[0].transpose(1, 2, 0), want, rtol=0, atol=1e-5)
    else:
        assert values.dtype == np.uint8
        assert np.array_equal(values[0], np.clip(np.rint(want), 0, 255).astype(np.uint8))

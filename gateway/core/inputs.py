"""Image bytes -> the serialized PredictRequest, in the input form the model's signature asks.

The form is read once per model version (`plan_input`: the signature's single input plus the
model config) and is the same for every task:
- uint8 / float32 pixels, NHWC [N,H,W,3] or NCHW [N,3,H,W]: the decoded, EXIF-oriented RGB
  pixels, resized to the signature's fixed size (or the config's `resize`, or down to its
  `max_side`, or letterboxed on its `pad_to` canvas: gateway.core.letterbox), rescaled and
  normalised as the config says. uint8 NHWC at the image's own size is decoded straight into
  the request bytes (gateway.upstream.wire): no copies of a 1080p image's 6 MB of pixels.
- string [N] encoded images: the caller's original bytes untouched when TensorFlow can decode
  them to the same pixels (the model then sees the stored, un-oriented image, so detection
  boxes are mapped through the EXIF orientation afterwards). Other formats (WebP, TIFF, CMYK
  JPEG, ...) are decoded here and sent as PNG of the oriented image, and images over the
  config's `max_side` as a JPEG of the scaled-down image. `string_encoding = "base64url"`
  sends the bytes base64url-encoded (a ViT exported with its preprocessing); `"tf_example"`
  wraps them in a serialized tf.train.Example under `tf_example_key` (OD API, Model Garden).
- `resize_filter` resizes exactly as the exporter's library did (gateway.imaging.filters).
- `channel_order = "BGR"` reverses the channels of the pixels sent (mean and std are in the
  model's order); `name` picks the input of a signature that has several.

Each request holds one image (batch 1); gateway.core.coalescer stacks the tails of several
into one batch. build_input runs in a worker thread (decoding is CPU-bound), except for a
small plain JPEG when nothing else is in flight (`decodes_quickly`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import NamedTuple

import numpy as np

from gateway import errors
from gateway.core.letterbox import check_pad_to, decode_letterboxed, letterbox
from gateway.core.pixels import decode_into_request, normalise
from gateway.domain import BoxTransform
from gateway.imaging import filters, resize
from gateway.imaging.decode import decode_image, encode_png
from gateway.imaging.header import (
    ImageLimits,
    inspect_image,
    model_can_decode,
    plain_jpeg_info,
)
from gateway.imaging.orientation import orient_box
from gateway.models import InputPrep
from gateway.proto.tfswire.v1 import example_pb2
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.signatures import Signature
from gateway.upstream.wire import predict_request, string_request


class InputMode(Enum):
    """How an image is handed to the model."""

    PIXELS = "uint8 pixels"  # OD API image_tensor
    FLOAT_PIXELS = "float32 pixels"  # OD API float_image_tensor, or normalised floats
    ENCODED = "string [N] encoded images"  # OD API encoded_image_string_tensor


_PIXEL_DTYPES: dict[InputMode, tuple[np.dtype, int]] = {
    InputMode.PIXELS: (np.dtype(np.uint8), tfs.DT_UINT8),
    InputMode.FLOAT_PIXELS: (np.dtype("<f4"), tfs.DT_FLOAT),
}
_MODES: dict[int, InputMode] = {
    tfs.DT_UINT8: InputMode.PIXELS,
    tfs.DT_FLOAT: InputMode.FLOAT_PIXELS,
}
_DTYPE_NAMES: dict[str, int] = {"uint8": tfs.DT_UINT8, "float32": tfs.DT_FLOAT}


@dataclass(frozen=True)
class InputPlan:
    """The input form of one model version, with the preparation the gateway does."""

    key: str
    mode: InputMode
    layout: str = "NHWC"  # NHWC | NCHW (pixels only)
    size: tuple[int, int] | None = None  # (width, height) every image is resized to
    max_side: int | None = None  # longest side sent; larger images are scaled down
    scale: float | None = None  # pixel values (0..255) times this (float only)
    mean: tuple[float, float, float] | None = None  # then minus mean ...
    std: tuple[float, float, float] | None = None  # ... divided by std, per channel
    base64url: bool = False  # encoded images sent base64url-encoded (string inputs)
    tf_example_key: str | None = None  # encoded images sent in a tf.train.Example
    bgr: bool = False  # pixels sent in BGR order
    resize_filter: str | None = None  # exact resizing (gateway.imaging.filters); None: fast
    pad_to: tuple[int, int] | None = None  # (width, height) canvas images are letterboxed on
    pad_value: int = 0

    @property
    def plain_pixels(self) -> bool:
        """uint8 NHWC RGB at the image's own size: decoded straight into the request."""
        return (
            self.mode is InputMode.PIXELS
            and self.layout == "NHWC"
            and self.size is None
            and self.max_side is None
            and self.pad_to is None
            and not self.bgr
        )

    def describe(self) -> dict[str, object]:
        """The plan as `check-models` and the startup log show it."""
        plan: dict[str, object] = {"input": self.key, "form": self.mode.value}
        if self.mode is InputMode.ENCODED:
            encoding = "raw"
            if self.base64url:
                encoding = "base64url"
            elif self.tf_example_key is not None:
                encoding = f"tf_example ({self.tf_example_key})"
            plan["encoding"] = encoding
        else:
            plan["layout"] = self.layout
            plan["channel_order"] = "BGR" if self.bgr else "RGB"
            if self.scale is not None:
                plan["scale"] = self.scale
            if self.mean is not None:
                plan["mean"] = list(self.mean)
            if self.std is not None:
                plan["std"] = list(self.std)
        if self.pad_to is not None:
            width, height = self.pad_to
            plan["pad_to"] = f"{width}x{height} (letterbox, pad value {self.pad_value})"
        elif self.size is not None:
            plan["resize"] = f"{self.size[0]}x{self.size[1]}"
        elif self.max_side is not None:
            plan["max_side"] = self.max_side
        else:
            plan["resize"] = "none (the image's own size)"
            return plan
        if self.resize_filter is None:
            plan["resize_filter"] = "fast (DCT-scaled JPEG decode, libvips bilinear)"
        else:
            what = filters.DESCRIPTIONS[self.resize_filter]
            plan["resize_filter"] = f"{self.resize_filter} (exact: full decode, {what})"
        return plan


class ModelInput(NamedTuple):
    request: bytes  # the serialized PredictRequest
    width: int  # of the image as a viewer shows it
    height: int
    transform: BoxTransform | None  # model's box -> displayed image box; None when identical
    # (width, height) of the image the model received (before the graph's own resizing).
    sent: tuple[int, int] | None = None
    # For batching (gateway.core.coalescer): the input tensor's dtype and shape as sent
    # (batch dimension 1), and how many bytes at the end of `request` are this image's
    # element of it (its tensor_content, or its string value); 0 when it cannot be batched.
    dtype: int = 0
    shape: tuple[int, ...] = ()
    tail: int = 0


def plan_input(signature: Signature, prep: InputPrep) -> InputPlan:
    """The input form for `signature` with the model config's `prep`; BAD_MODEL otherwise."""
    inputs = signature.inputs
    what = f"model '{signature.model}' version {signature.version}"
    if prep.name is not None and prep.name not in inputs:
        raise errors.bad_model(
            f"the model config says input.name = '{prep.name}' but the '{signature.name}' "
            f"signature of {what} has no such input; it has {signature.describe()}"
        )
    if prep.name is None and len(inputs) > 1:
        raise errors.bad_model(
            f"{what} has several inputs in its '{signature.name}' signature "
            f"({signature.describe()}); set input.name in the model config to the one that "
            "takes the image (the others need default values in the signature)"
        )
    if inputs:
        key = prep.name or next(iter(inputs))
        spec = inputs[key]
        shape = spec.shape
        if spec.dtype == tfs.DT_STRING and shape is not None and len(shape) == 1:
            if prep.scale is not None or prep.mean is not None or prep.std is not None:
                raise errors.bad_model(
                    f"{what} takes encoded images (input '{key}': {spec.describe()}), but the "
                    "model config sets scale/mean/std, which are for models that take pixels"
                )
            if prep.resize_filter is not None:
                raise errors.bad_model(
                    f"{what} takes encoded images (input '{key}'), which its graph resizes: "
                    "input.resize_filter is for models that take pixels; remove it"
                )
            return InputPlan(
                key,
                InputMode.ENCODED,
                max_side=prep.max_side,
                base64url=prep.string_encoding == "base64url",
                tf_example_key=(
                    prep.tf_example_key if prep.string_encoding == "tf_example" else None
                ),
            )
        if spec.dtype in _MODES and shape is not None and len(shape) == 4:
            if prep.string_encoding != "raw":
                raise errors.bad_model(
                    f"the model config says input.string_encoding = '{prep.string_encoding}' "
                    f"but {what} takes pixels (input '{key}': {spec.describe()})"
                )
            return _pixel_plan(key, spec.dtype, shape, prep, what)
    raise errors.bad_model(
        f"{what} cannot be used by the gateway: its '{signature.name}' signature has "
        f"{signature.describe()}; the gateway needs one image input: string [-1] of encoded "
        "images, or uint8/float32 pixels [1,H,W,3] (NHWC) or [1,3,H,W] (NCHW)"
    )


def _pixel_plan(
    key: str, dtype: int, shape: tuple[int, ...], prep: InputPrep, what: str
) -> InputPlan:
    shown = str(list(shape)).replace(" ", "")
    layout = prep.layout
    if layout is None:
        layout = "NCHW" if shape[1] == 3 and shape[3] not in (3, -1) else "NHWC"
    channels, height, width = (shape[3], shape[1], shape[2]) if layout == "NHWC" else shape[1:]
    if channels not in (3, -1) or shape[0] not in (1, -1):
        raise errors.bad_model(
            f"{what} takes input '{key}' {shown}, which is not one RGB image in {layout} "
            f"layout ([1,H,W,3] or [1,3,H,W]); set input.layout in the model config if the "
            "layout is the other one"
        )
    if prep.dtype is not None and _DTYPE_NAMES[prep.dtype] != dtype:
        raise errors.bad_model(
            f"the model config says input.dtype = '{prep.dtype}' but {what} takes "
            f"{_dtype_word(dtype)} input '{key}'"
        )
    mode = _MODES[dtype]
    if mode is InputMode.PIXELS and (
        prep.scale is not None or prep.mean is not None or prep.std is not None
    ):
        raise errors.bad_model(
            f"{what} takes uint8 pixels, but the model config sets scale/mean/std, which "
            "need a float32 input"
        )
    size = None
    if prep.pad_to is not None:
        check_pad_to(shape, layout, key, what)
    if height > 0 and width > 0:
        size = (width, height)
        if prep.resize is not None and prep.resize != (height, width):
            raise errors.bad_model(
                f"the model config says input.resize = {list(prep.resize)} but {what} takes "
                f"{height}x{width} images (input '{key}' {shown})"
            )
    elif prep.resize is not None:
        size = (prep.resize[1], prep.resize[0])
    elif height > 0 or width > 0:
        raise errors.bad_model(
            f"{what} fixes only one side of its input '{key}' {shown}; set input.resize = "
            "[height, width] in the model config"
        )
    max_side = None if size is not None else prep.max_side
    if prep.resize_filter is not None and size is None and max_side is None:
        raise errors.bad_model(
            f"{what} takes images of any size (input '{key}' {shown}) and the config sets no "
            "input.resize or max_side: input.resize_filter has nothing to resize; remove it"
        )
    return InputPlan(
        key,
        mode,
        layout=layout,
        size=size,
        max_side=max_side,
        pad_to=None if prep.pad_to is None else (prep.pad_to[1], prep.pad_to[0]),
        pad_value=prep.pad_value,
        scale=prep.scale,
        mean=prep.mean,
        std=prep.std,
        bgr=prep.channel_order == "BGR",
        resize_filter=prep.resize_filter,
    )


def _dtype_word(dtype: int) -> str:
    return "uint8" if dtype == tfs.DT_UINT8 else "float32"


def forward_encoded(
    data: bytes, plan: InputPlan, envelope: bytes, limits: ImageLimits
) -> ModelInput | None:
    """For a string [N] model: the request carrying the caller's bytes untouched, or None
    when they must be transcoded or scaled down first (build_input does that).

    Reads the header only (well under a millisecond), so it may run on the event loop.
    Raises ImageError (gateway.imaging.errors) like build_input.
    """
    info = inspect_image(data, limits)
    if not model_can_decode(info):
        return None
    if plan.max_side is not None and max(info.width, info.height) > plan.max_side:
        return None
    transform = None
    if info.orientation != 1:
        transform = partial(orient_box, orientation=info.orientation)
    value = _encoded_value(data, plan)
    request = string_request(envelope, plan.key, value)
    sent = (info.stored_width, info.stored_height)
    return ModelInput(
        request, info.width, info.height, transform, sent, tfs.DT_STRING, (1,), len(value)
    )


def _encoded_value(data: bytes, plan: InputPlan) -> bytes:
    """The string tensor's value for encoded image `data`, as the plan says."""
    if plan.base64url:
        return base64.urlsafe_b64encode(data)
    if plan.tf_example_key is not None:
        feature = example_pb2.Feature(bytes_list=example_pb2.BytesList(value=[data]))
        features = example_pb2.Features(feature={plan.tf_example_key: feature})
        return example_pb2.Example(features=features).SerializeToString()
    return data


# A plain JPEG this small decodes in well under a millisecond (640x480 in 0.6 ms here,
# bench/results.md), about what a decode thread's wake-ups and the event loop's self-pipe
# cost in latency; larger images would hold up the loop for longer than that.
INLINE_MAX_PIXELS = 500_000


def decodes_quickly(data: bytes, plan: InputPlan, limits: ImageLimits) -> bool:
    """Whether building this request is one decode of a plain JPEG of at most
    INLINE_MAX_PIXELS straight into the request (its header read only: microseconds).
    Raises images' errors for a header over the limits, as build_input would."""
    if not plan.plain_pixels:
        return False
    info = plain_jpeg_info(data, limits)
    return info is not None and info.stored_width * info.stored_height <= INLINE_MAX_PIXELS


def build_input(data: bytes, plan: InputPlan, envelope: bytes, limits: ImageLimits) -> ModelInput:
    """The request for `data`: `envelope` (a PredictRequest without inputs) plus the image
    as input `plan.key`. Raises ImageError (gateway.imaging.errors) for an empty,
    undecodable or oversized image."""
    if plan.mode is InputMode.ENCODED:
        forwarded = forward_encoded(data, plan, envelope, limits)
        if forwarded is not None:
            return forwarded
        if plan.max_side is not None:
            info, pixels = resize.decode_within(data, limits, plan.max_side)
        else:
            info, pixels = decode_image(data, limits)
        # A scaled-down photo goes as JPEG (a tenth of a PNG's size); a transcoded original
        # as lossless PNG, so the model sees its exact pixels.
        scaled = pixels.shape[:2] != (info.height, info.width)
        encoded = resize.encode_jpeg(pixels) if scaled else encode_png(pixels)
        value = _encoded_value(encoded, plan)
        request = string_request(envelope, plan.key, value)
        sent = (pixels.shape[1], pixels.shape[0])
        return ModelInput(
            request, info.width, info.height, None, sent, tfs.DT_STRING, (1,), len(value)
        )

    if plan.plain_pixels:
        return _decode_into_request(data, plan, envelope, limits)
    transform = None
    if plan.pad_to is not None:
        info, pixels, transform = decode_letterboxed(data, limits, plan.pad_to, plan.pad_value)
    elif plan.size is not None:
        info, pixels = resize.decode_to_size(data, limits, plan.size, plan.resize_filter)
    elif plan.max_side is not None:
        info, pixels = resize.decode_within(data, limits, plan.max_side, plan.resize_filter)
    else:
        info, pixels = decode_image(data, limits)
    return _pixels_request(pixels, plan, envelope, info.width, info.height, transform)


def _pixels_request(
    pixels: np.ndarray,
    plan: InputPlan,
    envelope: bytes,
    width: int,
    height: int,
    transform: BoxTransform | None,
) -> ModelInput:
    """The request for a pixel-input model of `pixels` sized as the plan says (uint8 or the
    exact filters' float32 [h, w, 3]) of a `width` x `height` image as shown."""
    dtype, tensor_dtype = _PIXEL_DTYPES[plan.mode]
    sent_height, sent_width = pixels.shape[:2]
    shape = (
        (1, sent_height, sent_width, 3)
        if plan.layout == "NHWC"
        else (1, 3, sent_height, sent_width)
    )
    size = sent_height * sent_width * 3 * dtype.itemsize
    buffer = predict_request(envelope, plan.key, tensor_dtype, shape, size)
    out = np.frombuffer(buffer.payload, dtype=dtype).reshape(shape[1:])
    if plan.bgr:
        pixels = pixels[..., ::-1]
    source = pixels if plan.layout == "NHWC" else pixels.transpose(2, 0, 1)
    if dtype == np.uint8:
        np.copyto(out, filters.to_uint8(source))
    else:
        normalise(source, out, plan.scale, plan.mean, plan.std, plan.layout)
    return ModelInput(
        buffer.data, width, height, transform, (sent_width, sent_height), tensor_dtype, shape,
        size,
    )  # fmt: skip


class Crop(NamedTuple):
    """A region of an image the gateway has decoded (a pipeline's step runs its model on it):
    uint8 [h, w, 3] pixels as shown (a view of the image's), at (x, y) of the image, which
    is image_width x image_height. The model's answer maps to the image's pixels."""

    pixels: np.ndarray
    x: int
    y: int
    image_width: int
    image_height: int


def crop_box(
    box: tuple[float, float, float, float], crop: Crop, inner: BoxTransform | None
) -> tuple[float, float, float, float]:
    """A normalized (ymin, xmin, ymax, xmax) box of the crop (after the crop's own `inner`
    transform, a letterbox's) as a normalized box of the image."""
    if inner is not None:
        box = inner(box)
    height, width = crop.pixels.shape[:2]
    ymin, xmin, ymax, xmax = box
    image_height, image_width = crop.image_height, crop.image_width
    return (
        (crop.y + ymin * height) / image_height,
        (crop.x + xmin * width) / image_width,
        (crop.y + ymax * height) / image_height,
        (crop.x + xmax * width) / image_width,
    )


def build_crop_input(crop: Crop, plan: InputPlan, envelope: bytes) -> ModelInput:
    """The request for decoded pixels (a pipeline's crop): sized and prepared exactly as
    build_input prepares an image of those pixels sent as PNG, so a step answers a crop as
    its model answers that crop sent on its own; a string-input model gets the crop as PNG
    (lossless), or as JPEG when the plan scales it down (as build_input does)."""
    pixels = crop.pixels
    height, width = pixels.shape[:2]
    whole = (crop.x, crop.y, width, height) == (0, 0, crop.image_width, crop.image_height)
    inner: BoxTransform | None = None
    if plan.mode is InputMode.ENCODED:
        sent = pixels
        if plan.max_side is not None and max(width, height) > plan.max_side:
            sent = resize.resize(pixels, *resize.fit_within(width, height, plan.max_side))
            encoded = resize.encode_jpeg(sent)
        else:
            encoded = encode_png(np.ascontiguousarray(pixels))
        value = _encoded_value(encoded, plan)
        request = string_request(envelope, plan.key, value)
        mapped: BoxTransform | None = None if whole else partial(crop_box, crop=crop, inner=None)
        return ModelInput(
            request, crop.image_width, crop.image_height, mapped,
            (sent.shape[1], sent.shape[0]), tfs.DT_STRING, (1,), len(value),
        )  # fmt: skip
    if plan.pad_to is not None:
        pixels, inner = letterbox(pixels, plan.pad_to, plan.pad_value)
    elif plan.size is not None:
        pixels = _sized(pixels, plan.size, plan.resize_filter)
    elif plan.max_side is not None:
        pixels = _sized(pixels, resize.fit_within(width, height, plan.max_side), plan.resize_filter)
    transform = inner if whole else partial(crop_box, crop=crop, inner=inner)
    return _pixels_request(pixels, plan, envelope, crop.image_width, crop.image_height, transform)


def _sized(pixels: np.ndarray, size: tuple[int, int], resize_filter: str | None) -> np.ndarray:
    """Pixels at `size` (width, height) as gateway.imaging.resize sizes a decoded image."""
    if size == (pixels.shape[1], pixels.shape[0]):
        return pixels
    if resize_filter is not None:
        return filters.resize_exact(pixels, *size, resize_filter)
    return resize.resize(np.ascontiguousarray(pixels), *size)


def _decode_into_request(
    data: bytes, plan: InputPlan, envelope: bytes, limits: ImageLimits
) -> ModelInput:
    request, info = decode_into_request(data, plan.key, envelope, limits)
    shape = (1, info.height, info.width, 3)
    return ModelInput(
        request, info.width, info.height, None, (info.width, info.height), tfs.DT_UINT8,
        shape, info.height * info.width * 3,
    )  # fmt: skip

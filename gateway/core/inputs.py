"""Image bytes -> the serialized PredictRequest, in the input form the model's signature asks.

The form is read once per model version (gateway.core.plans.plan_input: the signature's
input plus the model config) and is the same for every task:
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

from gateway.core.letterbox import decode_letterboxed
from gateway.core.pixels import decode_into_request, normalise
from gateway.domain import BoxTransform
from gateway.imaging import filters, resize
from gateway.imaging.decode import decode_image, encode_png
from gateway.imaging.header import (
    ImageInfo,
    ImageLimits,
    inspect_image,
    model_can_decode,
    plain_jpeg_info,
)
from gateway.imaging.orientation import orient_box
from gateway.proto.tfswire.v1 import example_pb2
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
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


def forward_encoded(
    data: bytes,
    plan: InputPlan,
    envelope: bytes,
    limits: ImageLimits,
    info: ImageInfo | None = None,
) -> ModelInput | None:
    """For a string [N] model: the request carrying the caller's bytes untouched, or None
    when they must be transcoded or scaled down first (build_input does that).

    Reads the header only (well under a millisecond), so it may run on the event loop;
    `info`: the header as inspect_image read it already (the request's pricing did).
    Raises ImageError (gateway.imaging.errors) like build_input.
    """
    if info is None:
        info = inspect_image(data, limits)
    if not model_can_decode(info):
        return None
    if plan.max_side is not None and max(info.width, info.height) > plan.max_side:
        return None
    transform = None
    if info.orientation != 1:
        transform = partial(orient_box, orientation=info.orientation)
    value = encoded_value(data, plan)
    request = string_request(envelope, plan.key, value)
    sent = (info.stored_width, info.stored_height)
    return ModelInput(
        request, info.width, info.height, transform, sent, tfs.DT_STRING, (1,), len(value)
    )


def encoded_value(data: bytes, plan: InputPlan) -> bytes:
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
        value = encoded_value(encoded, plan)
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
    return pixels_request(pixels, plan, envelope, info.width, info.height, transform)


def pixels_request(
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


def _decode_into_request(
    data: bytes, plan: InputPlan, envelope: bytes, limits: ImageLimits
) -> ModelInput:
    request, info = decode_into_request(data, plan.key, envelope, limits)
    shape = (1, info.height, info.width, 3)
    return ModelInput(
        request, info.width, info.height, None, (info.width, info.height), tfs.DT_UINT8,
        shape, info.height * info.width * 3,
    )  # fmt: skip

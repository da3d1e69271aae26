"""Image bytes -> the serialized PredictRequest, in the input form the model's signature asks.

- uint8 / float32 [1,H,W,3] models get the decoded, EXIF-oriented RGB pixels. They are
  decoded straight into the request bytes (gateway.tensors.predict_request), so a 1080p image
  costs one decode and no copies of its 6 MB of pixels.
- string [N] models get the caller's original bytes untouched when TensorFlow can decode
  them to the same pixels; the model then sees the stored (un-oriented) image, so its boxes
  are mapped through the EXIF orientation afterwards. Other formats (WebP, TIFF, CMYK JPEG,
  ...) are decoded here and sent as PNG of the oriented image.

Runs in a worker thread: decoding is CPU-bound and must stay off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from gateway import images
from gateway.detections import BoxTransform
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tensors import RequestBuffer, predict_request, string_request
from gateway.tfserving import InputMode

_PIXEL_DTYPES: dict[InputMode, tuple[np.dtype, int]] = {
    InputMode.PIXELS: (np.dtype(np.uint8), tfs.DT_UINT8),
    # OD API float_image_tensor: values 0..255 as float32.
    InputMode.FLOAT_PIXELS: (np.dtype("<f4"), tfs.DT_FLOAT),
}


@dataclass(frozen=True)
class ModelInput:
    request: bytes  # the serialized PredictRequest
    width: int  # of the image as a viewer shows it
    height: int
    transform: BoxTransform | None  # model's box -> displayed image box; None when identical


def encoded_input(
    data: bytes, input_key: str, envelope: bytes, limits: images.ImageLimits
) -> ModelInput | None:
    """For a string [N] model: the request carrying the caller's bytes untouched, or None
    when TensorFlow would not decode them to the same pixels (build_input transcodes them).

    Reads the header only (well under a millisecond), so it may run on the event loop.
    Raises images.ImageError like build_input.
    """
    info = images.inspect_image(data, limits)
    if not images.model_can_decode(info):
        return None
    transform = None
    if info.orientation != 1:
        transform = partial(images.orient_box, orientation=info.orientation)
    request = string_request(envelope, input_key, data)
    return ModelInput(request, info.width, info.height, transform)


def build_input(
    data: bytes, mode: InputMode, input_key: str, envelope: bytes, limits: images.ImageLimits
) -> ModelInput:
    """The request for `data`: `envelope` (a PredictRequest without inputs) plus the image
    as input `input_key`. Raises images.ImageError for an empty, undecodable or oversized
    image."""
    if mode is InputMode.ENCODED:
        forwarded = encoded_input(data, input_key, envelope, limits)
        if forwarded is not None:
            return forwarded
        info, pixels = images.decode_image(data, limits)
        request = string_request(envelope, input_key, images.encode_png(pixels))
        return ModelInput(request, info.width, info.height, None)

    dtype, tensor_dtype = _PIXEL_DTYPES[mode]
    buffers: list[RequestBuffer] = []

    def into_request(info: images.ImageInfo) -> np.ndarray:
        shape = (info.height, info.width, 3)
        size = info.height * info.width * 3 * dtype.itemsize
        buffer = predict_request(envelope, input_key, tensor_dtype, (1, *shape), size)
        # Called again when Pillow takes over from a failed fast decode: the last one counts.
        buffers[:] = [buffer]
        if dtype == np.uint8:
            return np.frombuffer(buffer.payload, dtype=np.uint8).reshape(shape)
        # float32: decode into a scratch array; the conversion writes into the request.
        return np.empty(shape, np.uint8)

    info, pixels = images.decode_image(data, limits, into=into_request)
    (buffer,) = buffers
    if dtype != np.uint8:
        np.copyto(np.frombuffer(buffer.payload, dtype=dtype).reshape(pixels.shape), pixels)
    return ModelInput(buffer.data, info.width, info.height, None)

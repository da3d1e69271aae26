"""Image bytes -> the model's input tensor, in the mode the model's signature asks for.

- uint8 / float32 [1,H,W,3] models get the decoded, EXIF-oriented RGB pixels.
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
from gateway.tensors import image_tensor, string_tensor
from gateway.tfserving import InputMode


@dataclass(frozen=True)
class ModelInput:
    tensor: tfs.TensorProto
    width: int  # of the image as a viewer shows it
    height: int
    transform: BoxTransform | None  # model's box -> displayed image box; None when identical


def build_input(data: bytes, mode: InputMode, limits: images.ImageLimits) -> ModelInput:
    """Raises images.ImageError for an empty, undecodable or oversized image."""
    if mode is InputMode.ENCODED:
        info = images.inspect_image(data, limits)
        if images.model_can_decode(info):
            transform = None
            if info.orientation != 1:
                transform = partial(images.orient_box, orientation=info.orientation)
            return ModelInput(string_tensor([data]), info.width, info.height, transform)
        info, pixels = images.decode_image(data, limits)
        png = images.encode_png(pixels)
        return ModelInput(string_tensor([png]), info.width, info.height, None)
    info, pixels = images.decode_image(data, limits)
    if mode is InputMode.FLOAT_PIXELS:
        pixels = pixels.astype(np.float32)  # OD API float_image_tensor: values 0..255
    return ModelInput(image_tensor(pixels), info.width, info.height, None)

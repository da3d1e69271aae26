"""Pixels into request bytes: a plain uint8 image decoded straight into its PredictRequest,
and float32 normalisation in place (helpers of gateway.core.inputs)."""

from __future__ import annotations

import numpy as np

from gateway.imaging.decode import decode_image
from gateway.imaging.header import ImageInfo, ImageLimits
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.wire import RequestBuffer, predict_request


def normalise(
    pixels: np.ndarray,
    out: np.ndarray,
    scale: float | None,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
    layout: str,
) -> None:
    """float32 `out` = ((pixels * scale) - mean) / std, per channel, in place."""
    np.copyto(out, pixels, casting="unsafe")
    if scale is not None:
        out *= np.float32(scale)
    axis = (1, 1, 3) if layout == "NHWC" else (3, 1, 1)
    if mean is not None:
        out -= np.asarray(mean, dtype=np.float32).reshape(axis)
    if std is not None:
        out /= np.asarray(std, dtype=np.float32).reshape(axis)


def decode_into_request(
    data: bytes, key: str, envelope: bytes, limits: ImageLimits
) -> tuple[bytes, ImageInfo]:
    """The PredictRequest of `envelope` plus input `key`: the image's uint8 [1,H,W,3] pixels,
    decoded straight into the request bytes; and the image's info."""
    buffers: list[RequestBuffer] = []

    def into_request(info: ImageInfo) -> np.ndarray:
        shape = (info.height, info.width, 3)
        buffer = predict_request(
            envelope, key, tfs.DT_UINT8, (1, *shape), info.height * info.width * 3
        )
        # Called again when Pillow takes over from a failed fast decode: the last one counts.
        buffers[:] = [buffer]
        return np.frombuffer(buffer.payload, dtype=np.uint8).reshape(shape)

    info, _ = decode_image(data, limits, into=into_request)
    (buffer,) = buffers
    return buffer.data, info

"""The images the gateway refuses, as domain errors: each says what to change.

An over-limit image is TOO_LARGE (INVALID_ARGUMENT in gRPC, 413 in HTTP), not
RESOURCE_EXHAUSTED: the same image never passes, so clients and meshes must not retry it.
Every other refused image is INVALID_INPUT.
"""

from __future__ import annotations

from typing import Literal

from gateway.errors import GatewayError, Kind


class ImageError(GatewayError):
    """An image the gateway cannot use; str(e) tells the caller what to change."""

    KIND = Kind.INVALID_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(self.KIND, message)


class EmptyImage(ImageError):
    """The request carried no image bytes."""


class UnsupportedImage(ImageError):
    """The bytes are not in a supported format (or use a variant we cannot convert to RGB)."""


class CorruptImage(ImageError):
    """The bytes look like a supported format but cannot be decoded."""


class ImageTooLarge(ImageError):
    """The image is over a configured limit."""

    KIND = Kind.TOO_LARGE
    limit: Literal["bytes", "pixels"]
    actual: int
    maximum: int

    def __init__(
        self, message: str, *, limit: Literal["bytes", "pixels"], actual: int, maximum: int
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.actual = actual
        self.maximum = maximum

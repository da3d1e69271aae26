"""The Pillow-free JPEG header read (gateway.imaging.jpeghead) against Pillow's own.

Whenever the fast read answers, Pillow must read the same file to the same ImageInfo; when
Pillow refuses a file, the fast read must leave it to Pillow (None). Checked over generated
JPEGs (grayscale, RGB, CMYK, progressive, EXIF orientations, XMP, ICC, comments) and over
every truncation and thousands of seeded byte mutations of their headers.
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from gateway.imaging import jpeghead
from gateway.imaging.errors import ImageError, ImageTooLarge
from gateway.imaging.header import ImageInfo, ImageLimits, inspect_image, open_image

LIMITS = ImageLimits(max_bytes=64 * 1024 * 1024, max_pixels=50_000_000)
XMP = (
    b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description '
    b'tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
)


def _pixels(seed: int, width: int, height: int, mode: str) -> Image.Image:
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    array[height // 4 : height // 2, width // 4 : width // 2] = (200, 30, 60)
    return Image.fromarray(array).convert(mode)


def _jpeg(seed: int, mode: str = "RGB", width: int = 96, height: int = 64, **save) -> bytes:
    out = io.BytesIO()
    _pixels(seed, width, height, mode).save(out, format="JPEG", quality=85, **save)
    return out.getvalue()


def _exif(orientation: int, *, big_endian: bool = False, extra: bool = True) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    if extra:
        exif[0x010F] = "gateway tests"  # Make: an ASCII entry stored outside the IFD
        exif[0x011A] = 72.0  # XResolution: a RATIONAL
        exif[0x0128] = 2
    data = exif.tobytes()
    if big_endian:  # Pillow writes little-endian; swap by re-reading as a TIFF IFD
        exif.endian = ">"
        data = exif.tobytes()
    return data


def _samples() -> dict[str, bytes]:
    samples = {
        "rgb": _jpeg(1),
        "gray": _jpeg(2, "L"),
        "cmyk": _jpeg(3, "CMYK"),
        "progressive": _jpeg(4, progressive=True),
        "optimized": _jpeg(5, optimize=True),
        "subsampling 4:4:4": _jpeg(6, subsampling=0),
        "restart markers": _jpeg(7, restart_marker_blocks=1),
        "comment": _jpeg(8, comment=b"a comment"),
        "icc": _jpeg(9, icc_profile=b"\x00" * 300),
        "xmp": _jpeg(10, xmp=XMP),
        "1x1": _jpeg(11, width=1, height=1),
        "wide": _jpeg(12, width=2000, height=3),
    }
    for orientation in range(0, 10):
        samples[f"exif orientation {orientation}"] = _jpeg(
            20 + orientation, exif=_exif(orientation)
        )
    samples["exif big-endian"] = _jpeg(31, exif=_exif(6, big_endian=True))
    samples["exif orientation only"] = _jpeg(32, exif=_exif(8, extra=False))
    samples["exif and xmp"] = _jpeg(33, exif=_exif(3), xmp=XMP)
    samples["exif without orientation"] = _jpeg(34, exif=Image.Exif().tobytes())
    return samples


SAMPLES = _samples()


def pillow_info(data: bytes) -> ImageInfo | type[BaseException]:
    """Pillow's reading (the gateway's path before the fast read), or the error it raised."""
    try:
        image, info = open_image(data, LIMITS)
    except ImageError as e:
        return type(e)
    image.close()
    return info


def fast_info(data: bytes) -> ImageInfo | None:
    header = jpeghead.read(data)
    if header is None:
        return None
    width, height, components, orientation = header
    return ImageInfo("JPEG", "RGB" if components == 3 else "L", width, height, orientation)


def agree(data: bytes) -> None:
    fast = fast_info(data)
    if fast is not None:  # (fast_info applies no limits; inspect_image below does)
        assert pillow_info(data) in (fast, ImageTooLarge)
    # inspect_image (fast read first) gives what Pillow gives, error or info.
    try:
        got: ImageInfo | type[BaseException] = inspect_image(data, LIMITS)
    except ImageError as e:
        got = type(e)
    assert got == pillow_info(data)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_generated_jpegs_read_as_pillow_reads_them(name: str) -> None:
    agree(SAMPLES[name])


@pytest.mark.parametrize(
    ("name", "answers"),
    [
        ("rgb", True),
        ("gray", True),
        ("progressive", True),
        ("exif orientation 6", True),
        ("exif big-endian", True),
        ("cmyk", False),  # Pillow reads CMYK (and refuses nothing else there)
        ("xmp", False),  # an orientation may hide in XMP
    ],
)
def test_the_fast_read_answers_plain_files_and_leaves_the_rest_to_pillow(
    name: str, answers: bool
) -> None:
    assert (jpeghead.read(SAMPLES[name]) is not None) is answers


def test_orientation_comes_from_exif() -> None:
    for orientation in range(1, 9):
        header = jpeghead.read(SAMPLES[f"exif orientation {orientation}"])
        assert header is not None and header[3] == orientation
    assert jpeghead.read(SAMPLES["exif orientation 0"]) == (96, 64, 3, 1)  # out of range


def _header_end(data: bytes) -> int:
    """Offset just past the SOS segment's header."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")


@pytest.mark.parametrize("name", ["rgb", "exif orientation 6", "icc", "progressive"])
def test_every_truncation_of_the_header_reads_as_pillow_reads_it(name: str) -> None:
    data = SAMPLES[name]
    for cut in range(3, _header_end(data) + 8):
        agree(data[:cut])


@pytest.mark.parametrize("name", ["rgb", "gray", "exif orientation 6", "exif big-endian", "icc"])
def test_mutated_headers_read_as_pillow_reads_them(name: str) -> None:
    data = SAMPLES[name]
    end = _header_end(data)
    rng = random.Random(name)
    for _ in range(1500):
        mutated = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4))):
            position = rng.randrange(2, end)
            mutated[position] = rng.choice((0, 0xFF, 1, 8, rng.randrange(256)))
        agree(bytes(mutated))

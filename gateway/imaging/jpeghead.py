"""A JPEG header read without Pillow, for the common case only: string-mode requests read
every image's header on the event loop, where Pillow's parser would be most of a
string-mode request's own work.

`read(data)` walks the marker segments up to the start of scan and returns (width, height,
components, orientation), or None whenever the file is anything but plain: then Pillow reads
it (gateway.imaging.header), so damaged or unusual files get Pillow's answer and error
text. What is accepted gives what Pillow gives (tests/imaging/test_jpeghead.py compares
the two over generated and damaged files):

- one SOFn segment, 8-bit samples, 1 or 3 components (Pillow's "L" and "RGB");
- APPn, DQT, DHT, DAC, DRI, DNL, EXP and COM segments, each complete; DQT tables checked
  as Pillow checks them; JFIF APP0, ICC APP2 and Adobe APP14 segments long enough for
  Pillow's fixed reads;
- at most one EXIF APP1 whose IFD0 is well formed, with at most one orientation entry, a
  SHORT, and an XResolution, if any, a single RATIONAL; no XMP APP1 (Pillow also reads an
  orientation from XMP);
- no padding, stray bytes or restart markers between segments.
"""

from __future__ import annotations

from typing import Literal

SOS = 0xDA
# SOFn: C0-CF except DHT (C4), JPG (C8) and DAC (CC); Pillow also reads DHP (DE) as one.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC} | {0xDE}
# Segments Pillow skips or stores without parsing (beyond the special cases below).
_PLAIN = frozenset({0xC4, 0xCC, 0xDC, 0xDD, 0xDF, 0xFE}) | frozenset(range(0xE0, 0xF0))
_EXIF = b"Exif\x00\x00"
_XMP = b"http://ns.adobe.com/xap/1.0/\x00"
_ICC = b"ICC_PROFILE\x00"
_ORIENTATION_TAG = 0x0112
_SHORT = 3
_RATIONAL = 5
_X_RESOLUTION = 0x011A
# Bytes per value of TIFF field types 1..13 (Pillow skips entries of other types).
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}

Header = tuple[int, int, int, int]  # width, height, components, EXIF orientation


def read(data: bytes) -> Header | None:
    """(width, height, components, orientation) of a plain JPEG; None: ask Pillow."""
    size = len(data)
    pos = 2  # after SOI
    frame: tuple[int, int, int] | None = None
    exif: bytes | None = None
    while True:
        if pos + 4 > size or data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        length = (data[pos + 2] << 8) | data[pos + 3]
        end = pos + 2 + length
        if length < 2 or end > size:
            return None
        if marker == SOS:
            break
        if marker in _SOF:
            if frame is not None or length < 8 or data[pos + 4] != 8:
                return None
            components = data[pos + 9]
            if components not in (1, 3):
                return None
            height = (data[pos + 5] << 8) | data[pos + 6]
            width = (data[pos + 7] << 8) | data[pos + 8]
            frame = (width, height, components)
        elif marker == 0xDB:
            if not _tables_complete(data, pos + 4, end):
                return None
        elif marker in _PLAIN:
            if marker == 0xE1:
                if data.startswith(_EXIF, pos + 4):
                    if exif is not None:
                        return None  # Pillow joins several EXIF segments
                    exif = data[pos + 4 + len(_EXIF) : end]
                elif data.startswith(_XMP, pos + 4):
                    return None
            elif marker == 0xE0 and data.startswith(b"JFIF", pos + 4) and length < 9:
                return None  # Pillow reads the version at a fixed offset
            elif marker == 0xEE and data.startswith(b"Adobe", pos + 4) and length < 9:
                return None  # and the Adobe version
            elif marker == 0xE2 and data.startswith(_ICC, pos + 4) and length < 16:
                return None  # and each ICC chunk's count
        else:
            return None
        pos = end
    if frame is None or not frame[0] or not frame[1]:
        return None  # Pillow refuses a zero size
    orientation = 1 if exif is None else _orientation(exif)
    if orientation is None:
        return None
    return (*frame, orientation)


def _tables_complete(data: bytes, start: int, end: int) -> bool:
    """DQT: every table (8- or 16-bit) fits in the segment, as Pillow requires."""
    pos = start
    while pos < end:
        precision = 1 if data[pos] >> 4 == 0 else 2
        pos += 1 + 64 * precision
        if pos > end:
            return False
    return True


def _orientation(tiff: bytes) -> int | None:
    """Orientation from EXIF IFD0 (1 when absent or out of 1..8); None when the block is
    not simple enough to be sure Pillow reads it the same way."""
    order: Literal["little", "big"]
    if tiff.startswith(b"II*\x00"):
        order = "little"
    elif tiff.startswith(b"MM\x00*"):
        order = "big"
    else:
        return None
    size = len(tiff)
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd < 8 or ifd + 2 > size:
        return None
    count = int.from_bytes(tiff[ifd : ifd + 2], order)
    if ifd + 2 + 12 * count > size:
        return None
    found: int | None = None
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag = int.from_bytes(tiff[entry : entry + 2], order)
        kind = int.from_bytes(tiff[entry + 2 : entry + 4], order)
        values = int.from_bytes(tiff[entry + 4 : entry + 8], order)
        unit = _TYPE_SIZES.get(kind)
        if unit is None:
            return None
        if unit * values > 4:  # stored elsewhere: it must be there for Pillow to agree
            offset = int.from_bytes(tiff[entry + 8 : entry + 12], order)
            if offset + unit * values > size:
                return None
        if tag == _X_RESOLUTION and (kind != _RATIONAL or values != 1):
            return None  # Pillow's DPI read from EXIF can fail on other forms
        if tag == _ORIENTATION_TAG:
            if found is not None or kind != _SHORT or values != 1:
                return None
            found = int.from_bytes(tiff[entry + 8 : entry + 10], order)
    if found is None:
        return 1
    return found if 1 <= found <= 8 else 1

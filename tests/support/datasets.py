"""Generated datasets for the batch tests: small scenes plus the damaged inputs a real
dataset has (corrupt files, a zero-byte file, a header claiming a huge image)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.jobs.runner.tfrecord import encode_record
from gateway.proto.tfswire.v1 import example_pb2
from serving import scenes


def huge_png() -> bytes:
    """A valid PNG header (with a correct CRC) for a 100000 x 100000 image and no pixels."""
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF)
    )


@dataclass(frozen=True)
class Image:
    key: str
    data: bytes
    kind: str  # "good", "corrupt", "empty", "huge"


def make_images(count: int, seed: int = 0) -> list[Image]:
    """`count` images: 2 % corrupt (every 50th), one zero-byte file, one huge header."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(count):
        key = f"img-{i:05d}.png"
        if i == 7:
            images.append(Image(key, b"", "empty"))
        elif i == 13:
            images.append(Image(key, huge_png(), "huge"))
        elif i % 50 == 25:
            good = scenes.encode(scenes.generate_scene(rng, 48, 40, 2).pixels)
            images.append(Image(key, good[: len(good) // 3], "corrupt"))  # truncated PNG
        else:
            scene = scenes.generate_scene(rng, 48, 40, int(rng.integers(0, 3)))
            images.append(Image(key, scenes.encode(scene.pixels), "good"))
    return images


def write_directory(root: Path, images: list[Image]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for image in images:
        (root / image.key).write_bytes(image.data)
    return root


def write_manifest(path: Path, images: list[Image], image_dir: str) -> Path:
    """Paths relative to the manifest for even lines, base64 bytes for odd ones, an id on
    every third line, metadata on all; plus one line that is not JSON (at index 3)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, image in enumerate(images):
        if i == 3:
            lines.append("{not json")
            continue
        entry: dict[str, object] = {"n": i}
        if i % 3 == 0:
            entry["id"] = f"m-{i}"
        if i % 2 == 0:
            entry["image"] = f"{image_dir}/{image.key}"
        else:
            entry["image_bytes"] = base64.b64encode(image.data).decode()
        lines.append(json.dumps(entry))
    path.write_text("\n".join(lines) + "\n")
    return path


def example(image: bytes, source_id: str | None = None, filename: str | None = None) -> bytes:
    ex = example_pb2.Example()
    features = ex.features.feature
    features["image/encoded"].bytes_list.value.append(image)
    features["image/format"].bytes_list.value.append(b"png")
    if source_id is not None:
        features["image/source_id"].bytes_list.value.append(source_id.encode())
    if filename is not None:
        features["image/filename"].bytes_list.value.append(filename.encode())
    features["image/height"].int64_list.value.append(40)
    return ex.SerializeToString()


def write_tfrecords(root: Path, images: list[Image], files: int, corrupt: int | None) -> Path:
    """`files` TFRecord files; record ids alternate source_id / filename / none. Record
    `corrupt` (global position) gets a flipped data byte (its CRC no longer matches)."""
    root.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(images) // files)
    for f in range(files):
        chunk = images[f * per_file : (f + 1) * per_file]
        out = bytearray()
        for j, image in enumerate(chunk):
            position = f * per_file + j
            kind = position % 3
            data = example(
                image.data,
                source_id=f"s-{position}" if kind == 0 else None,
                filename=image.key if kind == 1 else None,
            )
            record = bytearray(encode_record(data))
            if position == corrupt:
                record[12 + len(data) // 2] ^= 0xFF
            out += record
        (root / f"part-{f:03d}.tfrecord").write_bytes(bytes(out))
    return root

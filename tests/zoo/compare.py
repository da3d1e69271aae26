"""The zoo's comparisons of the gateway's answers with the libraries' (tests/zoo/build.py), one
function per task, each returning what differs (empty when they agree), so that a test can
assert agreement and another that a wrong preprocessing breaks it; and the model config as
TOML, for tests that change it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import model_pb2

# Every class's score, against the library's: the zoo's classifiers spread their classes
# (build.sharpen), so a wrong channel order, mean or resizing moves scores by far more.
SCORE_TOLERANCE = 1e-4
DETECTION_SCORE_TOLERANCE = 1e-3
BOX_TOLERANCE_PX = 1.0
TIMEOUT = 120


def image(zoo: Path, expected: Mapping[str, Any], photo: str) -> bytes:
    return (zoo / "images" / expected["images"][photo]["file"]).read_bytes()


def classifier_differences(
    channel: grpc.Channel, model: str, zoo: Path, expected: Mapping[str, Any]
) -> dict[str, float]:
    """photo -> the largest difference of any class's score from the library's, for each
    photo where it is over SCORE_TOLERANCE or the top 5 differ."""
    stub = cpb_grpc.ClassificationServiceStub(channel)
    differences = {}
    for photo, want in expected["expected"][model].items():
        request = cpb.ClassifyRequest(
            image=image(zoo, expected, photo),
            model=model_pb2.ModelSpec(name=model),
            top_k=len(want),
        )
        result = stub.Classify(request, timeout=TIMEOUT)
        got = np.zeros(len(want))
        for c in result.classes:
            got[c.class_id] = c.score
        largest = float(np.abs(got - np.asarray(want)).max())
        ranked = np.argsort(-np.asarray(want), kind="stable")[:5].tolist()
        returned = [c.class_id for c in result.classes[:5]]
        if largest > SCORE_TOLERANCE or (returned != ranked and not _ties(want, returned)):
            differences[photo] = largest
    return differences


def _ties(want: list[float], returned: list[int]) -> bool:
    """Whether `returned` is the library's top 5 up to classes tied within the tolerance."""
    scores = [want[c] for c in returned]
    ranked = sorted(want, reverse=True)[:5]
    return all(abs(a - b) <= SCORE_TOLERANCE for a, b in zip(scores, ranked, strict=True))


def detector_differences(
    channel: grpc.Channel, model: str, zoo: Path, expected: Mapping[str, Any]
) -> dict[str, str]:
    """photo -> what differs from the library's detections (count, or the first detection
    without a match: same class, score within 1e-3, box within 1 px of the shown image).
    Where the library has other answers as exact as its first (`alternatives`: a decoder
    whose output changes with the order of scores tied within float32 rounding,
    tests/zoo/ties.py), matching any of them is agreement."""
    stub = pb_grpc.DetectionServiceStub(channel)
    settings = expected["settings"]
    differences = {}
    for photo, want in expected["expected"][model].items():
        request = pb.DetectRequest(
            image=image(zoo, expected, photo),
            model=model_pb2.ModelSpec(name=model),
            min_score=settings["min_score"],
            max_detections=settings["max_detections"],
        )
        result = stub.Detect(request, timeout=TIMEOUT)
        got = [
            (d.class_id, d.score, (d.box.x_min, d.box.y_min, d.box.x_max, d.box.y_max))
            for d in result.detections
        ]
        assert [g[1] for g in got] == sorted((g[1] for g in got), reverse=True)
        size = expected["images"][photo]
        answers = [want, *want.get("alternatives", [])]
        assert all(len(a["scores"]) >= 3 for a in answers), f"{model}/{photo}: too few to compare"
        found = [_difference(got, answer, size) for answer in answers]
        if found[0] is not None and None not in found:
            differences[photo] = found[0]
    return differences


def _difference(
    got: Sequence[tuple[int, float, tuple[float, ...]]],
    want: Mapping[str, Any],
    size: Mapping[str, int],
) -> str | None:
    """What differs between the gateway's detections and one answer of the library's."""
    # Boxes are results within the image: the reference's are clipped to it, as the
    # gateway's are (a raw YOLO head's reach past the edges).
    limits = np.array([size["width"], size["height"]] * 2, dtype=np.float64)
    boxes = [np.clip(box, 0, limits).tolist() for box in want["boxes"]]
    wanted = list(zip(want["classes"], want["scores"], boxes, strict=True))
    if len(got) != len(wanted):
        return f"{len(got)} detections, the library's {len(wanted)}"
    unmatched = list(got)
    for class_id, score, box in wanted:
        match = next((g for g in unmatched if _same(g, class_id, score, box)), None)
        if match is None:
            return f"no match for {(class_id, score, box)} in {unmatched}"
        unmatched.remove(match)
    return None


def _same(got: tuple[int, float, tuple[float, ...]], class_id: int, score: float, box: Any) -> bool:
    return (
        got[0] == class_id
        and abs(got[1] - score) <= DETECTION_SCORE_TOLERANCE
        and all(abs(a - b) <= BOX_TOLERANCE_PX for a, b in zip(got[2], box, strict=True))
    )


def to_toml(config: Mapping[str, Any]) -> str:
    """A model config ({"models": {name: {key: value, "input": {...}, ...}}}) as TOML."""
    lines = []
    for name, table in config["models"].items():
        lines.append(f"[models.{name}]")
        subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items() if k not in subtables]
        for key, subtable in subtables.items():
            if subtable:
                lines.append(f"[models.{name}.{key}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in subtable.items()]
    return "\n".join(lines) + "\n"

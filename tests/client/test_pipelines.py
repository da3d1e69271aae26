"""Pipelines from the client (gateway/client/pipelines.py): GatewayClient.run_pipeline and its
stream, HttpClient.run_pipeline, and `python -m gateway.client --pipeline` over both doors, on
the in-process doors' `box_colours` (tests/support/doormodels.py: the detector's centre box,
its colour attached under `colour`, and a step whose model TF Serving lacks)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from PIL import Image

from gateway.client import GatewayClient, HttpCallError, HttpClient, pipeline_request
from gateway.client.cli import main as client_main
from tests.support.doors import InProcessDoors

PIPELINE = "box_colours"
BACKGROUND = (10, 10, 250)


def picture(centre: tuple[int, int, int], size: int = 80) -> bytes:
    """A picture whose centre half (the fake detector's box) is `centre`, on blue."""
    pixels = np.full((size, size, 3), BACKGROUND, np.uint8)
    pixels[size // 4 : 3 * size // 4, size // 4 : 3 * size // 4] = centre
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def crop_png(image: bytes, box: tuple[int, int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(image)).crop(box).save(out, "PNG")
    return out.getvalue()


def test_run_pipeline_attaches_what_the_step_model_answers_for_the_crop(
    doors: InProcessDoors,
) -> None:
    image = picture((250, 10, 10))
    with GatewayClient(doors.grpc_target) as client:
        result = client.run_pipeline(image, PIPELINE, request_id="frame-1")
        (found,) = result.detections.detections
        box = found.box
        assert (box.x_min, box.y_min, box.x_max, box.y_max) == (20, 20, 60, 60)
        alone = client.classify(crop_png(image, (20, 20, 60, 60)), model="colours", top_k=2)
    assert result.pipeline == PIPELINE and result.request_id == "frame-1"
    (instance,) = result.instances
    colour = instance.steps["colour"]
    assert (colour.parent, colour.step) == (0, "colour")
    assert [(c.label, c.score) for c in colour.classes.classes] == [
        (c.label, pytest.approx(c.score, abs=1e-6)) for c in alone.classes
    ]
    assert colour.classes.classes[0].label == "red"  # the crop's colour, not the picture's
    missing = instance.steps["missing"]
    assert missing.WhichOneof("result") is None
    assert missing.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert [(s.name, s.crops, s.failed) for s in result.steps] == [
        ("colour", 1, 0),
        ("missing", 1, 1),
    ]


def test_run_pipeline_stream_answers_in_order(doors: InProcessDoors) -> None:
    colours = [(250, 10, 10), (10, 250, 10), (250, 10, 10)]
    with GatewayClient(doors.grpc_target) as client:
        images = (picture(c) for c in colours)
        results = list(client.run_pipeline_stream(images, PIPELINE, min_score=0.5))
    tops = [r.instances[0].steps["colour"].classes.classes[0].label for r in results]
    assert tops == ["red", "green", "red"]


def test_the_http_client_answers_the_same_result(doors: InProcessDoors) -> None:
    image = picture((10, 250, 10))
    with GatewayClient(doors.grpc_target) as client:
        over_grpc = client.run_pipeline(image, PIPELINE, request_id="same", max_detections=3)
    over_http = HttpClient(doors.http_url).run_pipeline(
        image, PIPELINE, request_id="same", max_detections=3
    )
    assert json_format.MessageToDict(over_http) == json_format.MessageToDict(over_grpc)


def test_an_unknown_pipeline_or_option_is_refused_naming_what_there_is(
    doors: InProcessDoors,
) -> None:
    with pytest.raises(ValueError, match=r"top_k is not an option of a pipeline run \(its"):
        pipeline_request(b"x", PIPELINE, top_k=3)
    with GatewayClient(doors.grpc_target) as client, pytest.raises(grpc.RpcError) as refused:
        client.run_pipeline(picture((1, 2, 3)), "nope")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert PIPELINE in refused.value.details()
    with pytest.raises(HttpCallError) as over_http:
        HttpClient(doors.http_url).run_pipeline(picture((1, 2, 3)), "nope")
    assert (over_http.value.status, over_http.value.code) == (404, "NOT_FOUND")
    assert PIPELINE in over_http.value.message


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("door", ["grpc", "http", "stream"])
def test_the_command_prints_a_json_line_per_image(
    doors: InProcessDoors, door: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = []
    for index, colour in enumerate([(250, 10, 40), (10, 250, 40)]):
        paths.append(tmp_path / f"{index}.png")
        paths[-1].write_bytes(picture(colour))
    where = {
        "grpc": [f"--target={doors.grpc_target}"],
        "http": [f"--http={doors.http_url}"],
        "stream": [f"--target={doors.grpc_target}", "--stream"],
    }[door]
    code = client_main([*map(str, paths), f"--pipeline={PIPELINE}", "--min-score=0.5", *where])
    assert code == 0  # a failed crop is the crop's, not the image's
    first, second = lines(capsys)
    assert first["image"] == str(paths[0]) and first["pipeline"] == PIPELINE
    assert (first["image_width"], first["image_height"]) == (80, 80)
    (found,) = first["detections"]["detections"]
    assert found["label"] == "a box" and found["box"]["x_min"] == 20
    (instance,) = first["instances"]
    assert instance["id"] == 0
    colour = instance["steps"]["colour"]
    assert (colour["parent"], colour["step"]) == (0, "colour")
    assert [c["label"] for c in colour["classes"]["classes"]] == ["red", "blue"]
    assert "error" not in colour
    assert instance["steps"]["missing"]["error"]["code"] == "NOT_FOUND"
    assert "no_such_model" in instance["steps"]["missing"]["error"]["message"]
    assert "classes" not in instance["steps"]["missing"]
    assert second["instances"][0]["steps"]["colour"]["classes"]["classes"][0]["label"] == "green"
    assert [(s["name"], s["crops"], s["failed"]) for s in first["steps"]] == [
        ("colour", 1, 0),
        ("missing", 1, 1),
    ]


def test_the_command_names_an_unknown_pipeline(
    doors: InProcessDoors, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(picture((250, 10, 10)))
    for where in (f"--target={doors.grpc_target}", f"--http={doors.http_url}"):
        assert client_main([str(path), "--pipeline=nope", where]) == 1
        (line,) = lines(capsys)
        assert line["error"]["code"] == "NOT_FOUND" and PIPELINE in line["error"]["message"]


@pytest.mark.parametrize(
    "flag", ["--task=classify", "--model=detector", "--version=1", "--label=stable", "--top-k=3"]
)
def test_the_command_refuses_what_a_pipeline_run_does_not_take(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        client_main([str(tmp_path / "x.png"), f"--pipeline={PIPELINE}", flag, "--target=x:1"])
    assert refused.value.code == 2
    message = capsys.readouterr().err
    assert f"{flag.partition('=')[0]} cannot go with --pipeline" in message
    assert "a run takes --min-score and --max-detections" in message


def test_the_command_draws_the_boxes_with_their_steps_captions(
    doors: InProcessDoors, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(picture((250, 10, 10), size=200))
    out = tmp_path / "drawn.png"
    where = f"--target={doors.grpc_target}"
    assert client_main([str(path), f"--pipeline={PIPELINE}", where, f"--draw={out}"]) == 0
    (line,) = lines(capsys)
    plain = tmp_path / "plain.png"
    assert client_main([str(path), "--task=detect", where, f"--draw={plain}"]) == 0
    drawn = np.asarray(Image.open(out).convert("RGB")).astype(int)
    alone = np.asarray(Image.open(plain).convert("RGB")).astype(int)
    # The detection as the task draws it, and two captions (colour, missing) stacked under
    # its label, inside the box's top: only there does the drawing differ.
    box = line["detections"]["detections"][0]["box"]
    assert box == {"x_min": 50, "y_min": 50, "x_max": 150, "y_max": 150}
    changed = np.argwhere(np.any(drawn != alone, axis=-1))
    assert len(changed)
    (top, left), (bottom, _) = changed.min(axis=0), changed.max(axis=0)
    assert top >= 50 and left >= 50 and bottom < 50 + 2 * (12 + 6)
    assert np.any(np.all(drawn[50 + 12 + 6 : 50 + 2 * (12 + 6), 60:80] == (255, 0, 255), -1))

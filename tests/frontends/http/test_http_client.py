"""`python -m gateway.client`: the same results over gRPC and `--http`, and `--draw`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from gateway.client import DRAW_COLOUR
from serving import scenes
from tests.support.gatewayproc import GatewayProcess

ROOT = Path(__file__).resolve().parents[3]
SCENE = scenes.generate_scene(
    np.random.default_rng(21), 480, 360, 3, background=(128, 128, 128), min_side=50
)


def client(*args: str) -> tuple[int, list[dict]]:
    run = subprocess.run(
        [sys.executable, "-m", "gateway.client", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run.returncode, [json.loads(line) for line in run.stdout.splitlines()]


def without_ids(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in line.items() if k != "request_id"} for line in lines]


def drawn_edges(path: Path, detections: list[dict]) -> None:
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    assert pixels.shape == (SCENE.height, SCENE.width, 3)
    mask = np.abs(pixels - np.array(DRAW_COLOUR)).sum(axis=-1) < 30
    for d in detections:
        b = d["box"]
        # The left, right and bottom edges (the label sits on the top one) are drawn.
        assert mask[b["y_min"] + 20 : b["y_max"] - 2, b["x_min"]].all(), d
        assert mask[b["y_min"] + 20 : b["y_max"] - 2, b["x_max"] - 1].all(), d
        assert mask[b["y_max"] - 1, b["x_min"] + 2 : b["x_max"] - 2].all(), d
    assert mask.mean() < 0.2


def test_grpc_and_http_give_the_same_lines_and_drawings(
    http_gateway: GatewayProcess, tmp_path: Path
) -> None:
    image = tmp_path / "scene.png"
    image.write_bytes(scenes.encode(SCENE.pixels, "PNG"))
    code, over_grpc = client(
        str(image),
        f"--target={http_gateway.target}",
        "--min-score=0.5",
        f"--draw={tmp_path / 'grpc.png'}",
    )
    assert code == 0, over_grpc
    code, over_http = client(
        str(image),
        f"--http={http_gateway.http_url}",
        "--min-score=0.5",
        f"--draw={tmp_path / 'http.png'}",
    )
    assert code == 0, over_http
    assert without_ids(over_http) == without_ids(over_grpc)
    (line,) = over_http
    assert len(line["detections"]) == 3
    drawn_edges(tmp_path / "grpc.png", line["detections"])
    drawn_edges(tmp_path / "http.png", line["detections"])
    assert np.array_equal(
        np.asarray(Image.open(tmp_path / "grpc.png")), np.asarray(Image.open(tmp_path / "http.png"))
    )


def test_http_client_routes_versions_classification_and_errors(
    http_gateway: GatewayProcess, tmp_path: Path
) -> None:
    image = tmp_path / "scene.png"
    image.write_bytes(scenes.encode(SCENE.pixels, "PNG"))
    code, (line,) = client(
        str(image),
        f"--http={http_gateway.http_url}",
        "--model=detector",
        "--label=stable",
        "--max-detections=1",
    )
    assert code == 0 and line["model"] == {"name": "detector", "version": 1}
    assert len(line["detections"]) == 1
    blue = tmp_path / "blue.png"
    blue.write_bytes(scenes.encode(np.full((40, 40, 3), (10, 10, 250), np.uint8), "PNG"))
    code, lines = client(
        str(blue),
        str(image),
        f"--http={http_gateway.http_url}",
        "--task=classify",
        "--model=colours",
        "--top-k=1",
        f"--draw={tmp_path / 'classes.png'}",
    )
    assert code == 0
    assert lines[0]["classes"] == [{"class_id": 2, "label": "blue", "score": 1.0}]
    assert (tmp_path / "classes-0.png").is_file() and (tmp_path / "classes-1.png").is_file()
    code, (line,) = client(str(image), f"--http={http_gateway.http_url}", "--model=nope")
    assert code == 1
    assert line["error"]["code"] == "NOT_FOUND" and line["error"]["http_status"] == 404

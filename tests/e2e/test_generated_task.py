"""A task is its folder, its proto and one line of registration (issue 44.2's acceptance):
tests/support/newtask.py writes the `palette` task from scratch into a copy of the gateway
(nothing else of it changes, which this checks), and the copy's own processes serve it through
every door: gRPC (grpcurl by reflection, unary and the client command's stream), HTTP (curl),
`--draw`, check-models, detection-batch and a batch job over the API, and the page.

The model is the reference `classifier_scores`: its float [1, 8] output is each palette colour's
share of the image, so a picture half red and half blue has shares 0.5 and 0.5."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support import newtask, tools
from tests.support.gatewayproc import GatewayProcess, run_gateway, with_path
from tests.support.jobshttp import curl, ok, post_json, wait_done
from tests.support.localserver import run_local_server

MODEL = "classifier_scores"
CONFIG = f"""
default_model = "{MODEL}"
[models.{MODEL}]
task = "palette"
labels = "{newtask.ROOT / "serving" / "labels.txt"}"
min_share = 0.1
[models.{MODEL}.input]
scale = 0.00392156862745098
"""


def halves(left: tuple[int, int, int], right: tuple[int, int, int]) -> bytes:
    pixels = np.zeros((60, 80, 3), np.uint8)
    pixels[:, :40], pixels[:, 40:] = left, right
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


RED_BLUE = halves((255, 0, 0), (0, 0, 255))
GREEN_WHITE = halves((0, 255, 0), (255, 255, 255))


def shares(result: dict) -> dict[str, float]:
    return {s["label"]: round(s["share"], 3) for s in result["shares"]}


@dataclass
class Served:
    copy: Path
    gateway: GatewayProcess
    images: Path
    config: Path
    upstream: str

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`python -m ...` of the copy."""
        return subprocess.run([sys.executable, "-m", *argv], cwd=self.copy,
                              env=with_path(self.copy), capture_output=True, text=True,
                              timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def served(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    copy = newtask.copy_repository(tmp_path_factory.mktemp("repo"))
    newtask.write(copy)
    root = tmp_path_factory.mktemp("generated")
    images = root / "images"
    images.mkdir()
    (images / "a.png").write_bytes(RED_BLUE)
    (images / "b.png").write_bytes(GREEN_WHITE)
    config = root / "gateway-models.toml"
    config.write_text(CONFIG)
    serving = root / "models.config"
    serving.write_text(f"model_config_list {{ config {{ name: '{MODEL}' base_path: "
                       f"'{model_repo / MODEL}' model_platform: 'tensorflow' }} }}\n")  # fmt: skip
    args = [f"--model-config={config}", f"--job-store={root / 'jobs'}",
            f"--batch-allowed-input-uris={images}", "--batch-allow-anonymous=true"]  # fmt: skip
    with (
        run_local_server([f"--model_config_file={serving}"]) as tfs,
        run_gateway(tfs.target, args, http=True, root=copy) as gateway,
    ):
        yield Served(copy, gateway, images, config, tfs.target)


def test_adding_the_task_touched_its_folder_its_proto_and_one_line(served: Served) -> None:
    name = newtask.NAME
    generated = [f"gateway/proto/{name}/{p}" for p in ("__init__.py", "v1/__init__.py")]
    generated += [f"gateway/proto/{name}/v1/{name}_pb2{e}" for e in
                  (".py", ".pyi", "_grpc.py", "_grpc.pyi")]  # fmt: skip
    folder = [f"gateway/tasks/{name}/{file}" for file in newtask.FILES]
    proto = f"proto/{name}/v1/{name}.proto"
    assert newtask.changed(served.copy) == sorted(
        [*generated, *folder, "gateway/tasks/builtin.py", proto]
    )
    diff = subprocess.run(
        ["git", "diff", "--numstat", "gateway/tasks/builtin.py"],
        cwd=served.copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert diff.split()[:2] == ["1", "0"]  # one line added, none removed


def test_grpc_by_reflection_answers_the_new_service(served: Served) -> None:
    grpcurl = tools.binary("grpcurl", tools.GRPCURL_INSTALL)
    body = json.dumps({"image": base64.b64encode(RED_BLUE).decode(), "min_share": 0.2})
    done = subprocess.run([grpcurl, "-plaintext", "-d", body, served.gateway.target,
                           "palette.v1.PaletteService/Palette"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert shares(result) == {"red": 0.5, "blue": 0.5}
    assert result["model"]["name"] == MODEL and result["image_width"] == 80


def test_the_client_command_streams_and_draws_the_new_task(served: Served, tmp_path: Path) -> None:
    a, b = served.images / "a.png", served.images / "b.png"
    done = served.run("gateway.client", str(a), str(b), f"--target={served.gateway.target}",
                      "--task=palette", "--min-share=0.3", "--stream",
                      f"--draw={tmp_path / 'drawn.png'}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [shares(line) for line in lines] == [{"red": 0.5, "blue": 0.5},
                                                {"green": 0.5, "white": 0.5}]  # fmt: skip
    drawn = np.asarray(Image.open(tmp_path / "drawn-0.png").convert("RGB"))
    assert tuple(drawn[2, 1]) == (255, 0, 255)  # the task's rows, from its drawing.py


def test_http_answers_the_new_verb(served: Served) -> None:
    status, _, body = curl(f"{served.gateway.http_url}/v1/models/{MODEL}:palette?min_share=0.2",
                           "-H", "Content-Type: image/png", "--data-binary",
                           f"@{served.images / 'b.png'}")  # fmt: skip
    assert status == 200, body
    assert shares(json.loads(body)) == {"green": 0.5, "white": 0.5}
    status, _, body = curl(f"{served.gateway.http_url}/v1/models/{MODEL}:palette?min_share=2",
                           "-H", "Content-Type: image/png", "--data-binary",
                           f"@{served.images / 'b.png'}")  # fmt: skip
    assert status == 400 and b"min_share must be in [0, 1], got 2" in body


def test_check_models_shows_the_new_tasks_plan(served: Served) -> None:
    done = served.run("gateway", "check-models", "--json", f"--upstream={served.upstream}",
                      f"--model-config={served.config}")  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    checked = json.loads(done.stdout)
    (report,) = checked["models"]
    assert checked["ok"] and (report["model"], report["task"]) == (MODEL, "palette"), report
    assert report["trial"]["summary"]["classes"] >= 1, report  # its summary() in the trial


def test_detection_batch_runs_the_new_task(served: Served, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = served.run("gateway.jobs.runner", str(served.images), str(out),
                      f"--target={served.gateway.target}", "--task=palette",
                      "--min-share=0.3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for path in sorted(out.glob("*.jsonl"))
             for line in path.read_text().splitlines()]  # fmt: skip
    assert [(line["id"], shares(line["result"])) for line in lines] == [
        ("a.png", {"red": 0.5, "blue": 0.5}),
        ("b.png", {"green": 0.5, "white": 0.5}),
    ]


def test_a_batch_job_over_the_api_runs_the_new_task(served: Served) -> None:
    gateway = served.gateway
    body = {"input_uri": str(served.images), "task": "palette", "options": {"min_share": 0.3}}
    op = ok(post_json(gateway, "/v1/batchJobs", body))
    done = wait_done(gateway, op["name"])
    assert done["metadata"]["state"] == "SUCCEEDED", done
    status, _, results = curl(f"{gateway.http_url}/v1/{op['name']}/results")
    assert status == 200, results
    lines = [json.loads(line) for line in results.decode().splitlines()]
    assert [shares(line["result"]) for line in lines] == [{"red": 0.5, "blue": 0.5},
                                                          {"green": 0.5, "white": 0.5}]  # fmt: skip


def test_the_page_offers_the_new_task_with_its_renderer_and_option(served: Served) -> None:
    status, _, body = curl(served.gateway.http_url + "/")
    page = body.decode()
    assert status == 200
    assert '"palette"' in page and 'view.row("palette " + s.label' in page
    assert "min_share" in page

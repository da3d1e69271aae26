"""The page end to end for the tasks whose models the HTTP door's shared gateway does not
serve (keypoints, instance segmentation): a gateway process in front of the local TF Serving
with the task's own test models (exported as the task's end-to-end tests export them), the
page run on an image in headless chromium and its canvas read back against the JSON it drew.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image

from gateway.frontends.http.page import BOX_COLOUR
from tests.support import masks
from tests.support.browser import Page, Shown, run_page, with_page
from tests.support.gatewayproc import GatewayProcess, run_gateway
from tests.support.keypointmodels import MODEL_CONFIG as KEYPOINT_MODELS
from tests.support.keypointmodels import export_models as export_keypoint_models
from tests.support.keypointmodels import picture as keypoint_picture
from tests.support.localserver import run_local_server
from tests.support.segmentmodels import MODEL_CONFIG as MASK_MODELS
from tests.support.segmentmodels import export_model as export_mask_model
from tests.support.segmentmodels import picture as mask_picture
from tests.support.segmentmodels import shape as mask_shape

BOX_RGB = np.array([int(BOX_COLOUR[i : i + 2], 16) for i in (1, 3, 5)])


@pytest.fixture(scope="module")
def keypoint_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """`pose_yolo`: a YOLOv8-pose raw head putting COCO-17's keypoints on the diagonal of the
    image's red rectangle (tests/e2e/test_keypoints.py)."""
    root = tmp_path_factory.mktemp("page-keypoints")
    export_keypoint_models(root)
    config = root / "models.config"
    config.write_text(
        "model_config_list { config { name: 'pose_yolo' "
        f"base_path: '{root / 'pose_yolo'}' model_platform: 'tensorflow' }} }}\n"
    )
    (root / "gateway-models.toml").write_text(KEYPOINT_MODELS)
    with run_local_server([f"--model_config_file={config}"]) as tfs:
        args = [f"--model-config={root / 'gateway-models.toml'}", "--model=pose_yolo"]
        with run_gateway(tfs.target, args, log_dir=root, http=True) as gateway:
            yield gateway


def test_page_draws_the_keypoints_and_skeleton(keypoint_gateway: GatewayProcess, browser) -> None:
    png = keypoint_picture(320, 240, (60, 50, 260, 210))

    async def work(page: Page) -> Shown:
        return await run_page(page, keypoint_gateway.http_url, "pose_yolo", png, "image/png")

    shown = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    assert shown.status == "1 instances by pose_yolo version 1"
    (found,) = json.loads(shown.raw)["instances"]
    assert len(found["keypoints"]) == 17 and json.loads(shown.raw)["skeleton"]
    label = found["label"]
    names = ", ".join(k["name"] for k in found["keypoints"])
    assert shown.rows == [f"{label} 0.900: 17 of 17 keypoints scoring 0.5 or more ({names})"]
    drawn = np.abs(shown.pixels - BOX_RGB).sum(axis=-1) < 60
    for point in found["keypoints"]:
        assert drawn[round(point["y"]), round(point["x"])], point
    # Elsewhere (away from the diagonal the points and skeleton lie on, the box's outline
    # and its label) the picture is untouched.
    original = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    y, x = np.mgrid[:240, :320]
    near = np.abs((x - 60) * 160 - (y - 50) * 200) / np.hypot(160, 200) < 8
    box = (x >= 56) & (x < 264) & (y >= 46) & (y < 214)
    near |= box & ~((x >= 64) & (x < 256) & (y >= 54) & (y < 206))
    near |= (y >= 30) & (y < 52) & (x >= 58) & (x < 200)  # the label
    assert (shown.pixels[~near] == original[~near]).all()


@pytest.fixture(scope="module")
def segmentation_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """`masks`: a Mask R-CNN-style model whose one instance is the image's red pixels
    (tests/e2e/test_segmentation.py)."""
    root = tmp_path_factory.mktemp("page-segmentation")
    export_mask_model(root)  # root/masks (Mask R-CNN-style), root/masks_yolo (YOLOv8-seg)
    paths = {"masks": "masks", "masks_letterboxed": "masks", "masks_yolo": "masks_yolo"}
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f"config {{ name: '{name}' base_path: '{root / path}' model_platform: 'tensorflow' }}\n"
            for name, path in paths.items()
        )
        + "}\n"
    )
    (root / "gateway-models.toml").write_text(MASK_MODELS)
    (root / "labels.txt").write_text("background\nshape\n")
    with run_local_server([f"--model_config_file={config}"]) as tfs:
        args = [f"--model-config={root / 'gateway-models.toml'}", "--model=masks"]
        with run_gateway(tfs.target, args, log_dir=root, http=True) as gateway:
            yield gateway


@pytest.mark.parametrize("mask_format", ["rle", "polygon", "png"])
def test_page_draws_the_mask_in_every_format(
    segmentation_gateway: GatewayProcess, browser, mask_format: str
) -> None:
    truth = mask_shape(320, 240, (80, 60, 240, 200))
    png = mask_picture(truth)

    async def work(page: Page) -> Shown:
        url = segmentation_gateway.http_url
        return await run_page(page, url, "masks", png, "image/png", mask_format=mask_format)

    shown = asyncio.run(with_page(browser, work))
    assert shown.state == "done", shown.status
    assert shown.status == "1 instances by masks version 1"
    (found,) = json.loads(shown.raw)["instances"]
    mask = masks.decode(found["mask"])
    assert masks.iou(mask, truth) > 0.9
    assert shown.rows == [f"shape 0.900, mask of {int(mask.sum())} pixels"]
    # The overlay covers the mask's pixels and no others, but where the box's outline and
    # its label are drawn.
    b = found["box"]
    x0, y0, x1, y1 = b["x_min"], b["y_min"], b["x_max"], b["y_max"]
    y, x = np.mgrid[:240, :320]
    drawn = (x >= x0 - 1) & (x < x1 + 1) & (y >= y0 - 1) & (y < y1 + 1)
    drawn &= ~((x >= x0 + 3) & (x < x1 - 3) & (y >= y0 + 3) & (y < y1 - 3))
    drawn |= (y >= y0 - 17) & (y < y0 + 1) & (x >= x0 - 1) & (x < x0 + 120)
    original = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    changed = np.abs(shown.pixels - original).sum(axis=-1) > 0
    np.testing.assert_array_equal(changed & ~drawn, mask & ~drawn)

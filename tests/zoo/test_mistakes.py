"""The zoo's comparisons have teeth: a gateway whose model config makes one preprocessing
mistake gives answers that tests/zoo/compare.py tells apart from the library's, for every
model the mistake applies to: the classifiers, and the detectors that take pixels (the
gateway sends the others the encoded file, which their graph decodes).

- the channel order swapped (RGB models sent BGR, the caffe-style ResNet50 sent RGB);
- the mean subtraction dropped (models whose config sets `mean`; the others normalise in
  their graph);
- the fast resize instead of the exact one the config asks for (`resize_filter` removed):
  on the JPEGs the fast path decodes smaller (DCT scaling), at least.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import LocalServer
from tests.support.zoomistakes import DCT_SCALED, MISTAKES, wrong_config
from tests.zoo.compare import classifier_differences, detector_differences
from tests.zoo.conftest import DETECTORS

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(5400)]


# The detectors the gateway sends pixels (their graphs take no encoded file).
PIXEL_DETECTORS = (
    "mg_retinanet_image_tensor",
    "mg_retinanet_image_tensor_normalized",
    "yolo_v8_layout",
    "keras_hub_retinanet_decoded",
)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_wrong_preprocessing_fails_the_comparison(
    mistake: str,
    zoo: Path,
    zoo_expected: dict[str, Any],
    tfs: LocalServer,
    tmp_path: Path,
) -> None:
    config, changed = wrong_config(mistake, tmp_path)
    assert len(changed) >= 3, changed  # the mistake is tried on several exporters' models
    args = [f"--model-config={config}", f"--model={DETECTORS[0]}"]
    with (
        run_gateway(tfs.target, args, log_dir=tmp_path) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        for model in changed:
            differences = classifier_differences(channel, model, zoo, zoo_expected)
            assert differences, f"{mistake}: {model} still matches the library"
            if mistake == "fast resize":
                assert set(differences) >= DCT_SCALED, (model, differences)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_wrong_preprocessing_fails_the_detectors_comparison(
    mistake: str,
    zoo: Path,
    zoo_expected: dict[str, Any],
    tfs: LocalServer,
    tmp_path: Path,
) -> None:
    assert set(PIXEL_DETECTORS) <= set(DETECTORS)
    config, changed = wrong_config(mistake, tmp_path, PIXEL_DETECTORS)
    assert changed, f"{mistake} applies to no detector"
    args = [f"--model-config={config}", f"--model={DETECTORS[0]}"]
    with (
        run_gateway(tfs.target, args, log_dir=tmp_path) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        for model in changed:
            differences = detector_differences(channel, model, zoo, zoo_expected)
            assert differences, f"{mistake}: {model} still matches the library"

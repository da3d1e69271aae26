"""The zoo's embedders through the gateway (tests/zoo/embedders.py): a Keras application
exported without its top (average-pooled features) and a Hugging Face ViT vision tower
(`pooler_output`), served by serving.local, called through a real gateway process with
tests/zoo/models.toml, and compared with the vector the library computes with its own
preprocessing on PNGs and JPEGs of several sizes and aspect ratios, two EXIF-rotated: cosine
similarity at least 0.9999. The comparison has teeth: the references of different photos are
far apart, and a gateway whose config makes one preprocessing mistake (channels swapped, mean
dropped, the fast resize instead of the exact one) fails it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.proto.embedding.v1 import embedding_pb2_grpc as epb_grpc
from gateway.proto.vision.v1 import model_pb2
from tests.support.gatewayproc import CHANNEL_OPTIONS, run_gateway
from tests.support.localserver import LocalServer
from tests.support.zoomistakes import DCT_SCALED, MISTAKES, wrong_config
from tests.zoo.compare import TIMEOUT, image
from tests.zoo.conftest import DETECTORS, EMBEDDERS

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(5400)]

# The gateway's vector against the library's: float32 features through the same graph on
# (nearly) the same pixels. A wrong preprocessing moves them by far more (tested below).
MIN_COSINE = 0.9999
# The references of two different photos are at most this similar: the models' features
# follow the image, so agreeing at MIN_COSINE is agreeing on this image.
MAX_COSINE_BETWEEN_PHOTOS = 0.99


def cosine(a: Any, b: Any) -> float:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def embedder_cosines(
    channel: grpc.Channel, model: str, zoo: Path, expected: dict[str, Any]
) -> dict[str, float]:
    """photo -> cosine similarity of the gateway's vector with the library's."""
    stub = epb_grpc.EmbeddingServiceStub(channel)
    cosines = {}
    for photo, want in expected["expected"][model].items():
        request = epb.EmbedRequest(
            image=image(zoo, expected, photo), model=model_pb2.ModelSpec(name=model)
        )
        result = stub.Embed(request, timeout=TIMEOUT)
        assert result.dimension == len(result.embedding) == len(want)
        assert result.normalized
        assert abs(float(np.linalg.norm(result.embedding)) - 1.0) < 1e-5
        size = expected["images"][photo]
        assert (result.image_width, result.image_height) == (size["width"], size["height"])
        cosines[photo] = cosine(result.embedding, want)
    return cosines


@pytest.mark.parametrize("model", EMBEDDERS)
def test_embedder_gives_the_librarys_vector(
    model: str, zoo: Path, zoo_expected: dict[str, Any], channel: grpc.Channel
) -> None:
    photos = set(zoo_expected["expected"][model])
    # PNGs and JPEGs of several sizes and aspect ratios, two EXIF-rotated
    assert {"square224", "pano900x300", "photo1200x900", "exif6_600x800"} <= photos
    cosines = embedder_cosines(channel, model, zoo, zoo_expected)
    low = {photo: c for photo, c in cosines.items() if c < MIN_COSINE}
    assert low == {}, f"{model}: lowest cosine {min(cosines.values()):.6f}"


@pytest.mark.parametrize("model", EMBEDDERS)
def test_the_reference_depends_on_the_image(model: str, zoo_expected: dict[str, Any]) -> None:
    vectors = zoo_expected["expected"][model]
    for a, b in itertools.combinations(sorted(vectors), 2):
        assert cosine(vectors[a], vectors[b]) < MAX_COSINE_BETWEEN_PHOTOS, (model, a, b)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_wrong_preprocessing_fails_the_embedders_comparison(
    mistake: str,
    zoo: Path,
    zoo_expected: dict[str, Any],
    tfs: LocalServer,
    tmp_path: Path,
) -> None:
    config, changed = wrong_config(mistake, tmp_path, EMBEDDERS)
    assert changed, f"{mistake} applies to no embedder"
    args = [f"--model-config={config}", f"--model={DETECTORS[0]}"]
    with (
        run_gateway(tfs.target, args, log_dir=tmp_path) as gateway,
        grpc.insecure_channel(gateway.target, options=CHANNEL_OPTIONS) as channel,
    ):
        for model in changed:
            cosines = embedder_cosines(channel, model, zoo, zoo_expected)
            failed = {photo for photo, c in cosines.items() if c < MIN_COSINE}
            assert failed, f"{mistake}: {model} still matches the library"
            if mistake == "fast resize":
                assert failed >= DCT_SCALED, (model, cosines)

"""Fuzzing the two places hostile data enters: image bytes (`build_input`, what every request
goes through) and TF Serving's outputs (`map_detections`). Either a valid result or the
documented error, never anything else.

`make test` runs a fixed, derandomized set of examples (a few seconds); `make soak` runs many
more with fresh randomness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gateway.core.inputs import InputMode, InputPlan, ModelInput, build_input
from gateway.domain import ModelRef
from gateway.imaging.errors import ImageError
from gateway.imaging.header import ImageLimits
from gateway.labels import Labels
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.detection import REQUIRED_OUTPUTS, OutputError, map_detections
from gateway.upstream.client import request_envelope
from tests.reliability.conftest import SOAK, Figures, scaled
from tests.support import hostile

LIMITS = ImageLimits(max_bytes=4 * 1024 * 1024, max_pixels=4_000_000)
SEEDS = hostile.seeds()
MODES = (InputMode.PIXELS, InputMode.ENCODED)
INPUT_KEY = "input_tensor"
ENVELOPE = request_envelope(ModelRef("detector"), REQUIRED_OUTPUTS)
FUZZ = settings(
    max_examples=scaled(400, 20_000),
    derandomize=not SOAK,  # CI: the same examples every run
    deadline=None,
    database=None,  # no .hypothesis directory
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
outcomes: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def record_fuzz_counts(figures: Figures) -> Iterator[None]:
    """Records how many examples ran and how they ended, once the module's tests are done
    (whichever of them ran, in whatever order)."""
    yield
    if outcomes:
        figures.record(
            "fuzz", examples=sum(outcomes.values()), outcomes=dict(sorted(outcomes.items()))
        )


def check_image(data: bytes, mode: InputMode) -> str:
    """Runs build_input; returns the outcome's name. Any exception but ImageError fails."""
    try:
        result = build_input(data, InputPlan(INPUT_KEY, mode), ENVELOPE, LIMITS)
    except ImageError as e:
        assert str(e), "an image error must say what was wrong"
        return type(e).__name__
    assert isinstance(result, ModelInput)
    assert result.width >= 1 and result.height >= 1
    assert result.width * result.height <= LIMITS.max_pixels
    # The hand-serialized request parses as the PredictRequest it claims to be.
    request = tfs.PredictRequest.FromString(result.request)
    assert request.model_spec.name == "detector" and list(request.inputs) == [INPUT_KEY]
    tensor = request.inputs[INPUT_KEY]
    if mode is InputMode.PIXELS:
        dims = [d.size for d in tensor.tensor_shape.dim]
        assert sorted(dims[1:3]) == sorted((result.width, result.height)) and dims[3] == 3
        assert len(tensor.tensor_content) == result.width * result.height * 3
    else:
        assert len(tensor.string_val) == 1 and tensor.string_val[0]
    return "ok"


@pytest.mark.parametrize("name", list(SEEDS))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_every_seed_image_is_accepted(name: str, mode: InputMode) -> None:
    assert check_image(SEEDS[name], mode) == "ok"


@pytest.mark.parametrize("name", list(hostile.crafted()))
def test_lying_headers_are_refused_without_decoding(name: str) -> None:
    data = hostile.crafted()[name]
    for mode in MODES:
        with pytest.raises(ImageError) as info:
            build_input(data, InputPlan(INPUT_KEY, mode), ENVELOPE, LIMITS)
        message = str(info.value)
        if "declaring" in name and "x0" not in name:
            assert "megapixels" in message and "GATEWAY_MAX_PIXELS" in message, message
        if "ICC" in name:
            assert "ICC colour profile (iCCP chunk) decompresses to more than" in message
            assert "truncated" not in message


@pytest.mark.parametrize("compressed", ["zTXt", "iTXt"])
def test_png_text_that_inflates_past_the_guard_is_named(compressed: str) -> None:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    if compressed == "zTXt":
        info.add_text("Comment", "x" * 2_000_000, zip=True)
    else:
        info.add_itxt("Comment", "x" * 2_000_000, zip=True)
    data = hostile.encode(hostile.pattern(), "PNG", pnginfo=info)
    with pytest.raises(ImageError) as raised:
        build_input(data, InputPlan(INPUT_KEY, InputMode.PIXELS), ENVELOPE, LIMITS)
    assert f"its text ({compressed} chunk) decompresses to more than 1 MiB" in str(raised.value)


@FUZZ
@given(data=st.binary(max_size=4096), mode=st.sampled_from(MODES))
def test_random_bytes_give_an_image_error(data: bytes, mode: InputMode) -> None:
    outcome = check_image(data, mode)
    outcomes["random: " + outcome] += 1
    assert outcome != "ok", f"{len(data)} random bytes were accepted as an image: {data[:16]!r}"


@FUZZ
@given(
    name=st.sampled_from(sorted(SEEDS)),
    cut=st.floats(0.0, 1.0),
    edits=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=12),
    mode=st.sampled_from(MODES),
)
def test_truncated_and_corrupted_images_give_a_result_or_an_image_error(
    name: str, cut: float, edits: list[tuple[float, int]], mode: InputMode
) -> None:
    data = bytearray(SEEDS[name])
    for where, value in edits:
        data[min(int(where * len(data)), len(data) - 1)] = value
    if cut < 0.5:  # half the examples are truncated somewhere
        data = data[: int(cut * 2 * len(data))]
    outcomes["mutated: " + check_image(bytes(data), mode)] += 1


_floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def od_outputs(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """OD API-like outputs, mostly well formed, with any values in them."""
    n = draw(st.integers(0, 6))
    boxes_shape = draw(st.sampled_from([(1, n, 4), (1, n, 4), (n, 4), (1, n, 3), (2, n, 4)]))
    box_values = st.one_of(st.floats(0.0, 1.0, width=32), _floats)
    return {
        "detection_boxes": draw(hnp.arrays(np.float32, boxes_shape, elements=box_values)),
        "detection_scores": draw(
            hnp.arrays(np.float32, draw(st.sampled_from([(1, n), (1, n), (1, n + 1)])),
                       elements=st.one_of(st.floats(0.0, 1.0, width=32), _floats))
        ),
        "detection_classes": draw(
            hnp.arrays(np.float32, (1, n), elements=st.one_of(st.integers(0, 90), _floats))
        ),
        "num_detections": draw(
            hnp.arrays(np.float32, draw(st.sampled_from([(1,), (1,), (0,)])),
                       elements=st.one_of(st.integers(0, n + 1), _floats))
        ),
    }  # fmt: skip


@FUZZ
@given(
    outputs=od_outputs(),
    width=st.integers(1, 5000),
    height=st.integers(1, 5000),
    min_score=st.floats(0.0, 1.0),
    max_detections=st.integers(1, 10),
)
def test_any_model_output_maps_to_valid_detections_or_an_output_error(
    outputs: dict[str, np.ndarray], width: int, height: int, min_score: float, max_detections: int
) -> None:
    try:
        found = map_detections(
            outputs,
            width=width,
            height=height,
            labels=Labels(),
            min_score=min_score,
            max_detections=max_detections,
        )
    except OutputError as e:
        assert str(e)
        outcomes["outputs: OutputError"] += 1
        return
    outcomes["outputs: ok"] += 1
    assert len(found) <= max_detections
    assert [d.score for d in found] == sorted((d.score for d in found), reverse=True)
    for d in found:
        assert min_score <= d.score <= 1.0 and d.class_id >= 0
        assert 0 <= d.box.x_min <= d.box.x_max <= width
        assert 0 <= d.box.y_min <= d.box.y_max <= height

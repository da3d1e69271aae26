"""`[models.NAME.batching]` and `input.pad_to` in the model config file: read, defaulted and
refused naming the key, like the other tables; and the batch plan a signature gets."""

from __future__ import annotations

import pytest

from gateway.core.batching import DEFAULT_MAX_BATCH, plan_batching
from gateway.core.plans import plan_input
from gateway.domain import OutputPlan
from gateway.models import InputPrep, ModelConfigError, load_registry
from gateway.models.batching import BatchingConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.signatures import Signature, TensorSpec
from tests.support.modelconfigs import TASKS, config

HEAD = '[models.a]\ntask = "detection"\n'


def test_batching_and_pad_to_are_read(tmp_path):
    text = (
        HEAD + "[models.a.batching]\nenabled = true\nmax_batch = 16\nmax_delay_ms = 2.5\n"
        "[models.a.input]\npad_to = [480, 640]\npad_value = 114\n"
    )
    model = load_registry(config(tmp_path, text), "a", tasks=TASKS).get("a", "detection")
    assert model.batching == BatchingConfig(True, 16, 2.5)
    assert (model.input.pad_to, model.input.pad_value) == ((480, 640), 114)


def test_without_a_batching_table_the_signature_decides():
    assert BatchingConfig() == BatchingConfig(None, None, 0.0)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[models.a.batching]\nmax_batchh = 4\n", "unknown key 'models.a.batching.max_batchh'"),
        ("[models.a.batching]\nenabled = 1\n", "models.a.batching.enabled must be true or false"),
        ("[models.a.batching]\nmax_batch = 0\n", "models.a.batching.max_batch must be a whole"),
        ("[models.a.batching]\nmax_batch = 1000\n", "max_batch must be at most 256"),
        ("[models.a.batching]\nmax_delay_ms = -1\n", "max_delay_ms must be a number of milli"),
        ("[models.a.batching]\nmax_delay_ms = 5000\n", "max_delay_ms must be a number of milli"),
        ("[models.a.batching]\nenabled = false\nmax_batch = 4\n", "enabled = false with"),
        ("batching = 3\n", "models.a.batching must be a table"),
        ("[models.a.input]\npad_to = [480]\n", "models.a.input.pad_to must be [height, width]"),
        ("[models.a.input]\npad_to = [0, 640]\n", "models.a.input.pad_to must be [height, width]"),
        ("[models.a.input]\npad_value = 3\n", "models.a.input.pad_value needs pad_to"),
        ("[models.a.input]\npad_to = [4, 4]\npad_value = 300\n", "pad_value must be a pixel"),
        ("[models.a.input]\npad_to = [4, 4]\nmax_side = 9\n", "has pad_to with resize or max"),
        (
            '[models.a.input]\npad_to = [4, 4]\nstring_encoding = "base64url"\n',
            "take pixels, and so is pad_to",
        ),
    ],
)
def test_bad_batching_and_padding_are_refused_naming_the_key(tmp_path, table, message):
    with pytest.raises(ModelConfigError, match=r"models\.toml") as info:
        load_registry(config(tmp_path, HEAD + table), "a", tasks=TASKS)
    assert message in str(info.value)


def signature(dtype: int, shape: tuple[int, ...], output: tuple[int, ...] = (-1, 8)) -> Signature:
    return Signature(
        "m", 1, {"x": TensorSpec(dtype, shape)}, {"probabilities": TensorSpec(tfs.DT_FLOAT, output)}
    )


OUTPUTS = OutputPlan(("probabilities",))


@pytest.mark.parametrize(
    ("sig", "prep", "batching", "max_batch", "why"),
    [
        (signature(tfs.DT_FLOAT, (-1, 224, 224, 3)), InputPrep(), BatchingConfig(),
         DEFAULT_MAX_BATCH, "images resized to one size"),
        (signature(tfs.DT_FLOAT, (-1, 3, 224, 224)), InputPrep(), BatchingConfig(max_batch=32),
         32, "up to 32"),
        (signature(tfs.DT_STRING, (-1,)), InputPrep(), BatchingConfig(), 8, "encoded images"),
        (signature(tfs.DT_UINT8, (-1, -1, -1, 3)), InputPrep(pad_to=(480, 640)),
         BatchingConfig(max_delay_ms=2), 8, "letterboxed on the pad_to canvas"),
        (signature(tfs.DT_UINT8, (-1, -1, -1, 3)), InputPrep(), BatchingConfig(), 1,
         "set input.pad_to"),
        (signature(tfs.DT_UINT8, (-1, -1, -1, 3)), InputPrep(resize=(300, 300)),
         BatchingConfig(), 8, "resized to one size"),
        (signature(tfs.DT_UINT8, (1, -1, -1, 3)), InputPrep(), BatchingConfig(), 1,
         "fixes the batch of input 'x' (DT_UINT8 [1,-1,-1,3])"),
        (signature(tfs.DT_STRING, (1,)), InputPrep(), BatchingConfig(enabled=True), 1,
         "fixes the batch"),
        (signature(tfs.DT_FLOAT, (-1, 224, 224, 3), (1, 8)), InputPrep(), BatchingConfig(), 1,
         "output 'probabilities' (DT_FLOAT [1,8]) has no free batch dimension"),
        (signature(tfs.DT_FLOAT, (-1, 224, 224, 3)), InputPrep(), BatchingConfig(enabled=False),
         1, "batching.enabled = false"),
        (signature(tfs.DT_FLOAT, (-1, 224, 224, 3)), InputPrep(), BatchingConfig(max_batch=1),
         1, "max_batch = 1"),
    ],
)  # fmt: skip
def test_the_batch_plan_follows_the_signature_and_says_why(sig, prep, batching, max_batch, why):
    inputs = plan_input(sig, prep)
    plan = plan_batching(sig, inputs, OUTPUTS, batching)
    assert plan.max_batch == max_batch
    assert why in plan.reason
    shown = plan.describe()
    assert shown["enabled"] is (max_batch > 1) and shown["why"] == plan.reason
    if max_batch > 1:
        assert shown["max_delay_ms"] == batching.max_delay_ms

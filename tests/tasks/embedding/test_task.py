"""The embedding task: its model-config keys, the output it picks from a signature (or the
refusal that names the key to set), and a row of outputs -> the vector."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from gateway.config import Settings
from gateway.domain import Frame, OutputError
from gateway.errors import GatewayError, Kind
from gateway.models import ModelConfig, ModelConfigError
from gateway.models.file import parse_registry
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.tasks.builtin import built_in_tasks
from gateway.tasks.embedding import TASK, EmbeddingPlan
from gateway.tasks.embedding.config import EmbeddingConfig
from gateway.tasks.embedding.nouns import EmbedOptions
from gateway.upstream.signatures import Signature, TensorSpec

PATH = Path("models.toml")
FRAME = Frame(10, 10)
IMAGE = TensorSpec(tfs.DT_FLOAT, (-1, 224, 224, 3))


def read(text: str) -> EmbeddingConfig:
    """[models.m] of `text` (TOML), read by the gateway's model config with the built-ins."""
    data = tomllib.loads('[models.m]\ntask = "embedding"\n' + text)
    registry = parse_registry(data, PATH, "m", tasks=built_in_tasks().config_readers)
    own = registry.models["m"].task_config
    assert isinstance(own, EmbeddingConfig)
    return own


def config(own: EmbeddingConfig | None = None) -> ModelConfig:
    return ModelConfig("m", "embedding", task_config=own)


def signature(**outputs: TensorSpec) -> Signature:
    return Signature("m", 3, {"x": IMAGE}, outputs)


def floats(*shape: int) -> TensorSpec:
    return TensorSpec(tfs.DT_FLOAT, shape)


def test_the_defaults_recognise_the_output_and_normalise() -> None:
    assert read("") == EmbeddingConfig(embedding=None, normalize=True)
    named = read('[models.m.outputs]\nembedding = "pooler_output"\nnormalize = false\n')
    assert named == EmbeddingConfig(embedding="pooler_output", normalize=False)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("top_k = 3\n", "unknown key 'models.m.top_k'"),
        ('[models.m.outputs]\nlogits = "x"\n', "unknown key 'models.m.outputs.logits'"),
        ('[models.m.outputs]\nembedding = ""\n', "outputs.embedding must name an output"),
        ('[models.m.outputs]\nnormalize = "yes"\n', "outputs.normalize must be true or false"),
        ('labels = "labels.txt"\n', "models.m.labels: an embedding model has no classes"),
        ("outputs = 3\n", "models.m.outputs must be a table"),
    ],
)
def test_config_mistakes_are_refused_by_name(text: str, says: str) -> None:
    with pytest.raises(ModelConfigError) as refused:
        read(text)
    assert says in str(refused.value)
    assert str(refused.value).startswith("models.toml: ")


def test_the_only_float_matrix_is_recognised() -> None:
    vit = signature(last_hidden_state=floats(-1, 197, 96), pooler_output=floats(-1, 96))
    plan = TASK.output_plan(vit, config())
    assert plan == EmbeddingPlan(
        ("pooler_output",), "embedding", 96, True,
        "the signature's only float [batch, dimension] output",
    )  # fmt: skip
    keras = TASK.output_plan(signature(output_0=floats(-1, 576)), config())
    assert keras.output_filter == ("output_0",) and keras.dimension == 576


def test_a_named_output_wins_and_is_checked() -> None:
    clip = signature(image_embeds=floats(-1, 512), pooler_output=floats(-1, 768))
    plan = TASK.output_plan(clip, config(EmbeddingConfig("image_embeds", normalize=False)))
    assert plan.output_filter == ("image_embeds",) and not plan.normalize
    assert plan.describe()["found by"] == "model config"
    for own, says in [
        (EmbeddingConfig("missing"), "outputs.embedding = 'missing' but model 'm' version 3"),
        (EmbeddingConfig("tokens"), "output 'tokens' (outputs.embedding) is DT_FLOAT [-1,5,8]"),
    ]:
        with pytest.raises(GatewayError) as refused:
            TASK.output_plan(signature(tokens=floats(-1, 5, 8)), config(own))
        assert refused.value.kind is Kind.BAD_MODEL and says in refused.value.message


@pytest.mark.parametrize(
    ("outputs", "says"),
    [
        (
            {"image_embeds": floats(-1, 512), "pooler_output": floats(-1, 768)},
            "2 float [batch, dimension] outputs (image_embeds, pooler_output)",
        ),
        ({"tokens": floats(-1, 5, 8)}, "no float [batch, dimension] output"),
        ({"ids": TensorSpec(tfs.DT_INT64, (-1, 8))}, "no float [batch, dimension] output"),
    ],
)
def test_other_signatures_are_refused_naming_the_key(
    outputs: dict[str, TensorSpec], says: str
) -> None:
    with pytest.raises(GatewayError) as refused:
        TASK.output_plan(signature(**outputs), config())
    assert refused.value.kind is Kind.BAD_MODEL
    assert says in refused.value.message
    assert "outputs.embedding = '<output>'" in refused.value.message


def embed(row: list[float], dimensions: int = 0, normalize: bool = True) -> tuple[list, bool]:
    plan = EmbeddingPlan(("v",), "embedding", len(row), normalize)
    model = config()
    options = TASK.resolve(EmbedOptions(dimensions), model, model.rules(Settings()))
    outputs = {"v": np.array([row], np.float32)}
    result = TASK.map(outputs, plan, FRAME, options, config())
    return result.vector, result.normalized


def test_the_vector_is_divided_by_its_l2_norm_unless_the_config_says_not() -> None:
    assert embed([3.0, 4.0]) == ([0.6, 0.8], True)
    assert embed([3.0, 4.0], normalize=False) == ([3.0, 4.0], False)
    assert embed([3.0, 4.0, 12.0], dimensions=2) == ([0.6, 0.8], True)
    assert embed([0.0, 0.0]) == ([0.0, 0.0], False)  # no direction: returned as it is
    assert TASK.summary(TASK.map({"v": np.ones((1, 4))}, EmbeddingPlan(("v",)), FRAME, 0,
                                 config())) == {"dimension": 4, "normalized": True}  # fmt: skip


def test_out_of_range_dimensions_are_refused_as_the_callers_mistake() -> None:
    for dimensions, says in [(-1, "dimensions must be in [0, 65536]"), (3, "gives 2")]:
        with pytest.raises(GatewayError) as refused:
            embed([3.0, 4.0], dimensions=dimensions)
        assert refused.value.kind is Kind.INVALID_INPUT and says in refused.value.message


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (np.array([[1.0, np.nan]]), "NaN or infinite"),
        (np.array([[1, 2]], np.int32), "expected floats [1, dimension]"),
        (np.ones((1, 2, 3)), "expected floats [1, dimension]"),
        (np.ones((1, 0)), "a vector of no dimensions"),
    ],
)
def test_unusable_outputs_are_the_models_fault(value: np.ndarray, says: str) -> None:
    with pytest.raises(OutputError, match=re.escape(says)):
        TASK.map({"v": value}, EmbeddingPlan(("v",)), FRAME, 0, config())
    with pytest.raises(OutputError, match="lacks output 'v'"):
        TASK.map({}, EmbeddingPlan(("v",)), FRAME, 0, config())

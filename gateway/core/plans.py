"""How one model version is called for one task (`plan`, the one planner: the pipeline caches
it per version, job admission and check-models use it): its input form (`plan_input`, read
from the signature's single image input and the model config's `[models.NAME.input]`, the
same for every task), the outputs the task reads and how requests are batched; BAD_MODEL
naming what cannot be served and the key to set. The request is built from the input plan
by gateway.core.inputs (an image) and gateway.core.crops (a pipeline's crop)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.api.task import Task
from gateway.core.batching import BatchPlan, plan_batching
from gateway.core.inputs import InputMode, InputPlan
from gateway.core.letterbox import check_pad_to
from gateway.domain import OutputPlan
from gateway.models import InputPrep, ModelConfig
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.signatures import Signature

_MODES: dict[int, InputMode] = {
    tfs.DT_UINT8: InputMode.PIXELS,
    tfs.DT_FLOAT: InputMode.FLOAT_PIXELS,
}
_DTYPE_NAMES: dict[str, int] = {"uint8": tfs.DT_UINT8, "float32": tfs.DT_FLOAT}


def plan_input(signature: Signature, prep: InputPrep) -> InputPlan:
    """The input form for `signature` with the model config's `prep`; BAD_MODEL otherwise."""
    inputs = signature.inputs
    what = f"model '{signature.model}' version {signature.version}"
    if prep.name is not None and prep.name not in inputs:
        raise errors.bad_model(
            f"the model config says input.name = '{prep.name}' but the '{signature.name}' "
            f"signature of {what} has no such input; it has {signature.describe()}"
        )
    if prep.name is None and len(inputs) > 1:
        raise errors.bad_model(
            f"{what} has several inputs in its '{signature.name}' signature "
            f"({signature.describe()}); set input.name in the model config to the one that "
            "takes the image (the others need default values in the signature)"
        )
    if inputs:
        key = prep.name or next(iter(inputs))
        spec = inputs[key]
        shape = spec.shape
        if spec.dtype == tfs.DT_STRING and shape is not None and len(shape) == 1:
            if prep.scale is not None or prep.mean is not None or prep.std is not None:
                raise errors.bad_model(
                    f"{what} takes encoded images (input '{key}': {spec.describe()}), but the "
                    "model config sets scale/mean/std, which are for models that take pixels"
                )
            if prep.resize_filter is not None:
                raise errors.bad_model(
                    f"{what} takes encoded images (input '{key}'), which its graph resizes: "
                    "input.resize_filter is for models that take pixels; remove it"
                )
            return InputPlan(
                key,
                InputMode.ENCODED,
                max_side=prep.max_side,
                base64url=prep.string_encoding == "base64url",
                tf_example_key=(
                    prep.tf_example_key if prep.string_encoding == "tf_example" else None
                ),
            )
        if spec.dtype in _MODES and shape is not None and len(shape) == 4:
            if prep.string_encoding != "raw":
                raise errors.bad_model(
                    f"the model config says input.string_encoding = '{prep.string_encoding}' "
                    f"but {what} takes pixels (input '{key}': {spec.describe()})"
                )
            return _pixel_plan(key, spec.dtype, shape, prep, what)
    raise errors.bad_model(
        f"{what} cannot be used by the gateway: its '{signature.name}' signature has "
        f"{signature.describe()}; the gateway needs one image input: string [-1] of encoded "
        "images, or uint8/float32 pixels [1,H,W,3] (NHWC) or [1,3,H,W] (NCHW)"
    )


def _pixel_plan(
    key: str, dtype: int, shape: tuple[int, ...], prep: InputPrep, what: str
) -> InputPlan:
    shown = str(list(shape)).replace(" ", "")
    layout = prep.layout
    if layout is None:
        layout = "NCHW" if shape[1] == 3 and shape[3] not in (3, -1) else "NHWC"
    channels, height, width = (shape[3], shape[1], shape[2]) if layout == "NHWC" else shape[1:]
    if channels not in (3, -1) or shape[0] not in (1, -1):
        raise errors.bad_model(
            f"{what} takes input '{key}' {shown}, which is not one RGB image in {layout} "
            f"layout ([1,H,W,3] or [1,3,H,W]); set input.layout in the model config if the "
            "layout is the other one"
        )
    if prep.dtype is not None and _DTYPE_NAMES[prep.dtype] != dtype:
        raise errors.bad_model(
            f"the model config says input.dtype = '{prep.dtype}' but {what} takes "
            f"{_dtype_word(dtype)} input '{key}'"
        )
    mode = _MODES[dtype]
    if mode is InputMode.PIXELS and (
        prep.scale is not None or prep.mean is not None or prep.std is not None
    ):
        raise errors.bad_model(
            f"{what} takes uint8 pixels, but the model config sets scale/mean/std, which "
            "need a float32 input"
        )
    size = None
    if prep.pad_to is not None:
        check_pad_to(shape, layout, key, what)
    if height > 0 and width > 0:
        size = (width, height)
        if prep.resize is not None and prep.resize != (height, width):
            raise errors.bad_model(
                f"the model config says input.resize = {list(prep.resize)} but {what} takes "
                f"{height}x{width} images (input '{key}' {shown})"
            )
    elif prep.resize is not None:
        size = (prep.resize[1], prep.resize[0])
    elif height > 0 or width > 0:
        raise errors.bad_model(
            f"{what} fixes only one side of its input '{key}' {shown}; set input.resize = "
            "[height, width] in the model config"
        )
    max_side = None if size is not None else prep.max_side
    if prep.resize_filter is not None and size is None and max_side is None:
        raise errors.bad_model(
            f"{what} takes images of any size (input '{key}' {shown}) and the config sets no "
            "input.resize or max_side: input.resize_filter has nothing to resize; remove it"
        )
    return InputPlan(
        key,
        mode,
        layout=layout,
        size=size,
        max_side=max_side,
        pad_to=None if prep.pad_to is None else (prep.pad_to[1], prep.pad_to[0]),
        pad_value=prep.pad_value,
        scale=prep.scale,
        mean=prep.mean,
        std=prep.std,
        bgr=prep.channel_order == "BGR",
        resize_filter=prep.resize_filter,
    )


def _dtype_word(dtype: int) -> str:
    return "uint8" if dtype == tfs.DT_UINT8 else "float32"


@dataclass(frozen=True)
class Plan:
    """How one model version is called for one task."""

    input: InputPlan
    outputs: OutputPlan
    batch: BatchPlan


def plan(task: Task, signature: Signature, config: ModelConfig) -> Plan:
    """How `signature`'s model version is called for `task` with the model's config: its
    input, the outputs the task reads, how requests are batched; GatewayError BAD_MODEL
    naming what cannot be served. The one planner: the pipeline (cached per version), job
    admission and check-models use it."""
    inputs = plan_input(signature, config.input)
    outputs = task.output_plan(signature, config)
    return Plan(inputs, outputs, plan_batching(signature, inputs, outputs, config.batching))

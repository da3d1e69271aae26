"""The pipelines' public API (pipeline.v1, proto/pipeline/v1/pipeline.proto): RunRequest ->
the plain Request a cascade runs (gateway.core.cascade), its Tree -> PipelineResult.

A pipeline is called like a model: its name is the Request's `model.name`, and the request's
options are the first model's, over the pipeline's defaults (a dict of the options the caller
set: 0 is "the default", as in every task's request). The results of the steps are their
tasks' own result messages, put in the oneof field of that message type, so a step answers in
a pipeline what its model answers on its own.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, get_type_hints

from google.protobuf.descriptor import OneofDescriptor
from google.rpc import status_pb2

from gateway import errors
from gateway.api import strings
from gateway.api.bindings import Binding, Bindings, option_help
from gateway.api.status import code_of
from gateway.domain import ModelRef, Outcome, Request, StepAnswer, Trace, Tree
from gateway.errors import GatewayError
from gateway.proto.detection.v1 import detection_pb2 as dpb
from gateway.proto.pipeline.v1 import pipeline_pb2 as pb
from gateway.proto.vision.v1 import model_pb2 as vpb

# The task a pipeline's call is recorded under (the payload log's one event per tree).
TASK = "pipeline"


class PipelineOptions(NamedTuple):
    """A pipeline call's options: the first model's (0: the pipeline's default, then the
    model's)."""

    min_score: Annotated[float, "minimum score of the first model's instances, 0..1 (0: the "
                         "pipeline's default)"]  # fmt: skip
    max_detections: Annotated[int, "most instances the first model keeps (0: the pipeline's "
                              "default)"]  # fmt: skip


# RunRequest's fields that are the first model's options (0: the pipeline's default).
OPTIONS = PipelineOptions._fields
SERVICE = pb.DESCRIPTOR.services_by_name["PipelineService"]
# The oneofs holding a task's own answer: the first step's, and a step's for one crop.
FIRST = pb.PipelineResult.DESCRIPTOR.oneofs_by_name["first"]
STEP = pb.StepResult.DESCRIPTOR.oneofs_by_name["result"]


@dataclass(frozen=True)
class PipelineBinding(Binding):
    """Pipelines seen as one more task by what calls the gateway with images one by one (the
    batch runner, jobs): its service is PipelineService, a request's model name is the
    pipeline's, its options the first model's (OPTIONS), its result a PipelineResult."""

    results: Results | None = None

    def to_request(
        self, message: Any, request_id: str, method: str, timeout: float | None, trace: Trace
    ) -> Request:
        return to_request(message, request_id, method, timeout, trace)

    def to_result(self, outcome: Outcome) -> pb.PipelineResult:
        assert self.results is not None
        return self.results.to_result(outcome)

    def request(
        self, image: bytes, model: vpb.ModelSpec, request_id: str, **options: Any
    ) -> pb.RunRequest:
        return pb.RunRequest(image=image, pipeline=model.name, request_id=request_id, **options)

    def served(self, message: Any) -> vpb.ServedModel:
        """The first model's: a pipeline's answer is counted under the model that found its
        instances."""
        first = message.WhichOneof("first")
        return getattr(message, first).model if first else vpb.ServedModel()


@functools.cache
def binding(bindings: Bindings) -> PipelineBinding:
    """The pipelines' binding, with the tasks' `bindings` for the steps' results."""
    return PipelineBinding(
        task=TASK,
        verb=TASK,
        service=SERVICE,
        unary="Run",
        stream="RunStream",
        request_type=pb.RunRequest,
        result_type=pb.PipelineResult,
        options_type=PipelineOptions,
        fill_result=_no_fill,
        summary="Run a pipeline",
        options={
            name: option_help(PipelineOptions, name, hint)
            for name, hint in get_type_hints(PipelineOptions, include_extras=True).items()
        },
        results=Results(bindings),
    )


def _no_fill(result: Any, answer: Any) -> None:
    raise AssertionError("a pipeline's result is made by Results.to_result")


def check(message: pb.RunRequest) -> None:
    """The request message's own strings (its request id, the pipeline's name)."""
    strings.request_id(message.request_id)
    strings.check("pipeline", message.pipeline, strings.MAX_MODEL_NAME)
    if not message.pipeline:
        raise errors.invalid_input("pipeline must name a pipeline of the gateway's model config")


def to_request(
    message: pb.RunRequest, request_id: str, method: str, timeout: float | None, trace: Trace
) -> Request:
    return request(
        message.image, message.pipeline, options(message), request_id, method, timeout, trace
    )


def options(message: Any) -> dict[str, Any]:
    """The first model's options the caller set (nonzero) on a RunRequest."""
    return {name: getattr(message, name) for name in OPTIONS if getattr(message, name)}


def request(
    image: bytes,
    pipeline: str,
    options: Mapping[str, Any],
    request_id: str,
    method: str,
    timeout: float | None,
    trace: Trace,
) -> Request:
    return Request(image, ModelRef(pipeline), dict(options), request_id, timeout, method, trace)


class Results:
    """PipelineResult messages of cascades' Outcomes, with the tasks' bindings."""

    def __init__(self, bindings: Bindings) -> None:
        self._bindings = bindings
        # Each task's result message -> its field in PipelineResult's `first` and in
        # StepResult's `result` oneof.
        self._first = _by_result(FIRST, bindings)
        self._step = _by_result(STEP, bindings)

    def to_result(self, outcome: Outcome) -> pb.PipelineResult:
        tree: Tree = outcome.result
        result = pb.PipelineResult(
            pipeline=tree.pipeline,
            image_width=outcome.image_width,
            image_height=outcome.image_height,
            request_id=outcome.request_id,
        )
        first = self._bindings.for_task(tree.first_task).to_result(
            outcome._replace(result=tree.first)
        )
        getattr(result, self._first[first.DESCRIPTOR.full_name]).CopyFrom(first)
        tasks = {summary.name: summary.task for summary in tree.steps}
        for index, attached in enumerate(tree.attached):
            instance = result.instances.add(id=index)
            for name, answer in attached.items():
                self._fill(instance.steps[name], answer, tasks[name])
        for summary in tree.steps:
            report = result.steps.add(name=summary.name, crops=summary.crops, failed=summary.failed)
            if summary.model is not None:
                name, version = summary.model
                report.model.CopyFrom(vpb.ServedModel(name=name, version=version))
            for reason, ids in summary.skipped.items():
                report.skipped.add(reason=reason, count=len(ids), ids=ids)
        return result

    def _fill(self, message: pb.StepResult, answer: StepAnswer, task: str) -> None:
        message.parent = answer.parent
        message.step = answer.step
        x_min, y_min, x_max, y_max = answer.crop
        message.crop.CopyFrom(dpb.BoundingBox(x_min=x_min, y_min=y_min, x_max=x_max, y_max=y_max))
        if answer.outcome is not None:
            converted = self._bindings.for_task(task).to_result(answer.outcome)
            getattr(message, self._step[converted.DESCRIPTOR.full_name]).CopyFrom(converted)
        elif isinstance(answer.error, GatewayError):
            error = answer.error
            message.error.CopyFrom(
                status_pb2.Status(code=code_of(error.kind), message=error.message)
            )


def _by_result(oneof: OneofDescriptor, bindings: Bindings) -> dict[str, str]:
    """A result message's full name -> its field in `oneof` (answer_bindings, inverted)."""
    found = answer_bindings(oneof, bindings)
    return {binding.result_type.DESCRIPTOR.full_name: name for name, binding in found.items()}


def answer_bindings(oneof: OneofDescriptor, bindings: Bindings) -> dict[str, Binding]:
    """The fields of `oneof` (FIRST or STEP) -> the binding whose result message each holds
    (fields of a task these bindings lack are left out)."""
    by_type = {binding.result_type.DESCRIPTOR.full_name: binding for binding in bindings}
    return {
        field.name: by_type[field.message_type.full_name]
        for field in oneof.fields
        if field.message_type is not None and field.message_type.full_name in by_type
    }


def instances_field(binding: Binding) -> str | None:
    """The field of the binding's result message that lists the instances it found (the
    repeated message with a `box`: detections, instances); None when it has none."""
    for field in binding.result_type.DESCRIPTOR.fields:
        message = field.message_type
        if field.is_repeated and message is not None and "box" in message.fields_by_name:
            return str(field.name)
    return None


def uncarried(binding: Binding, first: bool) -> str:
    """ "" when a pipeline's answer can carry the binding's result message as its first
    step's (`first`) or a later step's; else the oneof that lacks it."""
    oneof = FIRST if first else STEP
    held = {field.message_type.full_name for field in oneof.fields if field.message_type}
    return "" if binding.result_type.DESCRIPTOR.full_name in held else str(oneof.full_name)

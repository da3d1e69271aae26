"""Pipelines (pipeline.v1, docs/pipelines.md) from Python: the RunRequest of one image, and
what the command line and `--draw` read from a PipelineResult: the binding whose answer its
first step gave, where that answer lists its instances, and a caption of each result the
steps attached to an instance ("colour: red 0.97"). No task is named here: the fields of the
result's oneofs are matched with the bindings' result messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.api.bindings import Binding, Bindings
from gateway.api.pipelines import FIRST, OPTIONS, STEP, answer_bindings, instances_field
from gateway.proto.pipeline.v1 import pipeline_pb2 as pb


def pipeline_request(
    image: bytes, pipeline: str, *, request_id: str = "", **options: Any
) -> pb.RunRequest:
    """The RunRequest of one image; `options` are the first model's (min_score,
    max_detections: 0 or None is the pipeline's default). ValueError naming an option a run
    does not take (a step's options are the pipeline's config)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)} is not an option of a pipeline run (its options: "
            f"{', '.join(OPTIONS)}); a step's options are set in the pipeline's config"
        )
    chosen = {name: value for name, value in options.items() if value}
    return pb.RunRequest(image=image, pipeline=pipeline, request_id=request_id, **chosen)


def first_answer(
    result: Mapping[str, Any], bindings: Bindings
) -> tuple[Binding, Mapping[str, Any], list[Mapping[str, Any]]]:
    """A PipelineResult as plain data -> the binding of its first step's answer, that answer,
    and its instances (in the order the result's `instances` number them). ValueError when
    it holds no first answer these bindings know."""
    for name, binding in answer_bindings(FIRST, bindings).items():
        if name in result:
            answer = result[name]
            field = instances_field(binding)
            return binding, answer, list(answer.get(field, [])) if field else []
    raise ValueError("the pipeline's answer holds no first step's result of a known task")


def captions(attached: Mapping[str, Any], order: list[str]) -> list[str]:
    """An instance's attached results (its `steps`, as plain data) as one caption each, in
    the steps' `order`: `step: <top label> <score>` for an answer listing labelled items
    (classes, detections: the first, as sorted by score, and how many more found), `step: N
    values` for a vector, `step: none` for an empty answer, `step: <code>` for a failed
    crop."""
    return [caption(name, attached[name]) for name in order if name in attached]


def caption(name: str, attached: Mapping[str, Any]) -> str:
    error = attached.get("error")
    if error:
        return f"{name}: {error.get('code', 'failed')}"
    answer: Mapping[str, Any] = next(
        (attached[field.name] for field in STEP.fields if field.name in attached), {}
    )
    labelled = numbers = None
    for value in answer.values():
        if not isinstance(value, list) or not value:
            continue
        if labelled is None and isinstance(value[0], Mapping) and "label" in value[0]:
            labelled = value
        elif numbers is None and isinstance(value[0], int | float):
            numbers = value
    if labelled is not None:
        top = labelled[0]
        more = f" +{len(labelled) - 1}" if "box" in top and len(labelled) > 1 else ""
        return f"{name}: {top['label']} {top.get('score', 0):.2f}{more}"
    if numbers is not None:
        return f"{name}: {len(numbers)} values"
    return f"{name}: none"

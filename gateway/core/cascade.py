"""Detect, then look closer: a pipeline ([pipelines.NAME], gateway.models.pipelines) runs a
first model that finds instances, then each step's model on the crop of every instance.

One call, one admission: the caller's slot is taken once for the whole tree, and every image
of it (the decoded picture, the first model's input, each crop) is priced and charged to the
caller's share before it runs (gateway.core.pipeline.Account). The picture is decoded once,
at full size and as the caller sees it (EXIF orientation applied); the first model's input
and every crop are cut from those pixels, never re-encoded for a pixel-input model: a crop is
resized and prepared exactly as the step model's input plan prepares an image of those pixels
(gateway.core.inputs.build_crop_input), so a step answers a crop as its model answers that
crop sent on its own as PNG. The crops of one step run concurrently, so the coalescer sends
the crops of this and other requests to a batching model in shared Predicts.

A crop's failure is that crop's (its StepAnswer.error), never the image's, unless its step
is `required`; the deadline and the caller going away end the whole call. Boxes, masks and
keypoints a step finds are in the caller's pixels (the crop's transform maps them back).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway import errors
from gateway.api.pipelines import OPTIONS, TASK, uncarried
from gateway.api.task import Task
from gateway.core.crops import Crop
from gateway.core.pipeline import Pipeline, new_request_id
from gateway.core.work import Account, in_thread
from gateway.domain import (
    Cost,
    Located,
    ModelRef,
    Outcome,
    Request,
    StepAnswer,
    StepSummary,
    Tree,
    Work,
)
from gateway.errors import GatewayError, Kind
from gateway.imaging.decode import decode_image
from gateway.imaging.header import ImageLimits, inspect_image
from gateway.models import ModelConfigError
from gateway.models.pipelines import PipelineConfig, StepConfig

log = logging.getLogger("gateway.pipeline")

# Crops of one request in flight at once: enough to fill a batching model's Predicts, few
# enough that one request's crops queue behind the decode threads' other work, not before it.
CROPS_IN_FLIGHT = 8


class Step(NamedTuple):
    config: StepConfig
    task: Task
    options: Any  # the step's request options, as its task's options type


@dataclass(frozen=True)
class Cascade:
    """A configured pipeline, checked against the tasks the gateway serves."""

    config: PipelineConfig
    first: Task
    options: Mapping[str, Any]  # the first model's configured request options
    steps: tuple[Step, ...]


def check_pipelines(
    configs: Mapping[str, PipelineConfig], pipeline: Pipeline
) -> dict[str, Cascade]:
    """Every configured pipeline checked against the served tasks and their options; raises
    ModelConfigError naming the pipeline and the key (the gateway does not start)."""
    checked: dict[str, Cascade] = {}
    registry = pipeline.registry
    for name, config in configs.items():
        where = f"[pipelines.{name}]"
        first = pipeline.tasks[registry.task_of(config.detect)]
        if not first.finds_instances or not set(OPTIONS) <= set(first.binding.options):
            raise ModelConfigError(
                f"{where} detect = '{config.detect}' is a {first.name} model, which finds no "
                "instances to crop; name a detection, instance_segmentation or keypoints model"
            )
        _answers(first, True, where, f"detect = '{config.detect}'")
        _options(first, config.options, registry.get(config.detect, first.name), pipeline,
                 f"{where} (the first model's options)")  # fmt: skip
        steps = []
        for step in config.steps:
            task = pipeline.tasks[registry.task_of(step.model)]
            _answers(task, False, where, f"step '{step.name}' (model '{step.model}')")
            options = _options(
                task, step.options, registry.get(step.model, task.name), pipeline,
                f"{where} step '{step.name}'",
            )  # fmt: skip
            steps.append(Step(step, task, options))
        checked[name] = Cascade(config, first, dict(config.options), tuple(steps))
    return checked


def _answers(task: Task, first: bool, where: str, what: str) -> None:
    """ModelConfigError unless pipeline.v1 can carry the task's result message there."""
    lacking = uncarried(task.binding, first)
    if lacking:
        raise ModelConfigError(
            f"{where} {what}: a pipeline cannot carry a {task.name} model's answer yet; add "
            f"its result message to {lacking} in proto/pipeline/v1/pipeline.proto "
            "(docs/adding-a-task.md)"
        )


def _options(
    task: Task, options: Mapping[str, Any], config: Any, pipeline: Pipeline, where: str
) -> Any:
    try:
        task.binding.check_options(options)
        made = task.binding.options_type(**options)
        task.resolve(made, config, config.rules(pipeline.settings))
    except GatewayError as exc:
        raise ModelConfigError(f"{where}: {exc.message}") from None
    return made


class Cascades:
    """The configured pipelines, run over the pipeline (gateway.core.pipeline) that runs
    each of their images."""

    def __init__(self, pipeline: Pipeline, configs: Mapping[str, PipelineConfig]) -> None:
        self.pipeline = pipeline  # what runs each image
        self.cascades = check_pipelines(configs, pipeline)
        self.settings = pipeline.settings
        self._limits = ImageLimits(pipeline.settings.max_image_bytes, pipeline.settings.max_pixels)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.cascades)

    def get(self, name: str) -> Cascade:
        """NOT_FOUND naming the pipelines there are."""
        cascade = self.cascades.get(name)
        if cascade is None:
            have = ", ".join(self.cascades) or "none (the model config has no [pipelines])"
            raise GatewayError(
                Kind.NOT_FOUND, f"the gateway has no pipeline named '{name}'; it has: {have}"
            )
        return cascade

    async def call(self, task: str, request: Request) -> Outcome:
        """A task's call on the pipeline, or a pipeline's (task TASK, its name the request's
        model's): what calls the gateway with images one by one (batch jobs) runs."""
        if task == TASK:
            return await self.run_named(request)
        return await self.pipeline.run(task, request)

    async def check(self, task: str, request: Request) -> None:
        """Raises the GatewayError every image like `request` would (batch job admission):
        for a task, Pipeline.check; for a pipeline, that it exists, and the first model's
        and every required step's model and options (an optional step's failure is its
        crops', never the image's)."""
        if task != TASK:
            await self.pipeline.check(task, request)
            return
        cascade = self.get(request.model.name)
        await self.pipeline.check(cascade.first.name, self._first(cascade, request))
        for step in cascade.steps:
            if step.config.required:
                model = ModelRef(step.config.model)
                step_request = Request(b"", model, step.options, trace=request.trace)
                await self.pipeline.check(step.task.name, step_request)

    def _first(self, cascade: Cascade, request: Request) -> Request:
        """The first model's request: the caller's options over the pipeline's defaults."""
        options = cascade.first.binding.options_type(**{**cascade.options, **request.options})
        return request._replace(model=ModelRef(cascade.config.detect), options=options)

    async def run_named(self, request: Request) -> Outcome:
        """run() for the pipeline a door's request names (its model.name)."""
        return await self.run(request.model.name, request)

    async def run(self, name: str, request: Request) -> Outcome:
        """Runs pipeline `name` on `request.image` (its options: the first model's, over the
        pipeline's defaults); GatewayError for the image or a required step's failure. The
        pipeline's observers (the payload log) are told of the whole tree once, as task
        gateway.api.pipelines.TASK; its images are counted and logged one by one."""
        started = time.perf_counter()
        request_id = request.request_id or new_request_id()
        outcome: Outcome | None = None
        failure: GatewayError | None = None
        try:
            outcome = await self._run(self.get(name), request, request_id)
            return outcome
        except GatewayError as exc:
            failure = exc
            raise
        except asyncio.CancelledError:
            failure = GatewayError(Kind.CANCELLED, "the call was cancelled")
            raise
        except Exception:  # a bug: logged with its traceback, answered as the pipeline does
            log.exception("unexpected error", extra={"fields": {"request_id": request_id}})
            failure = errors.internal(request_id)
            raise failure from None
        finally:
            seconds = time.perf_counter() - started
            for observe in self.pipeline.observers:
                observe(TASK, request, request_id, ModelRef(name), outcome, failure, seconds)

    async def _run(self, cascade: Cascade, request: Request, request_id: str) -> Outcome:
        name = cascade.config.name
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        first_request = self._first(cascade, request)
        # The options first, as a task's call judges them before its image.
        detect = self.pipeline.registry.get(cascade.config.detect, cascade.first.name)
        cascade.first.resolve(first_request.options, detect, detect.rules(self.settings))
        account = self.pipeline.admit(request.caller)
        try:
            work = Work(deadline)
            info = inspect_image(request.image, self._limits)  # header only: bounded first
            account.charge(Cost(pixels=info.width * info.height), work)
            _, pixels = await in_thread(
                self.pipeline.executor, work, decode_image, request.image, self._limits
            )
            height, width = pixels.shape[:2]
            first = await self.pipeline.run(
                cascade.first.name,
                first_request._replace(request_id=request_id, timeout=_left(deadline)),
                account=account,
                pixels=Crop(pixels, 0, 0, width, height),
                observe=False,
            )  # fmt: skip
            instances = cascade.first.instances(first.result) or ()
            attached: list[dict[str, StepAnswer]] = [{} for _ in instances]
            summaries = []
            for step in cascade.steps:
                summary = StepSummary(step.config.name, step.task.name)
                summaries.append(summary)
                chosen = _choose(step.config, instances, summary, width, height)
                answers = await self._step(
                    name, step, chosen, pixels, request, request_id, deadline, account
                )
                for answer in answers:
                    attached[answer.parent][step.config.name] = answer
                    if answer.outcome is not None:
                        summary.model = (answer.outcome.model_name, answer.outcome.model_version)
                    else:
                        summary.failed += 1
                summary.crops = len(answers)
            tree = Tree(name, cascade.first.name, first.result, attached, summaries)
            return first._replace(result=tree)
        finally:
            account.release()

    async def _step(
        self,
        name: str,
        step: Step,
        chosen: Sequence[tuple[int, tuple[int, int, int, int]]],
        pixels: Any,
        request: Request,
        request_id: str,
        deadline: float | None,
        account: Account,
    ) -> list[StepAnswer]:
        """The step's answers for the `chosen` (instance, crop box) pairs, in their order."""
        gate = asyncio.Semaphore(CROPS_IN_FLIGHT)
        height, width = pixels.shape[:2]
        method = f"Pipeline {name}/{step.config.name}"

        async def one(parent: int, box: tuple[int, int, int, int]) -> StepAnswer:
            x_min, y_min, x_max, y_max = box
            crop = Crop(pixels[y_min:y_max, x_min:x_max], x_min, y_min, width, height)
            async with gate:
                try:
                    outcome = await self.pipeline.run(
                        step.task.name,
                        Request(
                            b"", ModelRef(step.config.model), step.options,
                            f"{request_id}-{step.config.name}-{parent}", _left(deadline),
                            method, request.trace, request.caller,
                        ),
                        account=account, pixels=crop, observe=False,
                    )  # fmt: skip
                except GatewayError as exc:
                    if exc.kind in (Kind.DEADLINE, Kind.CANCELLED) or step.config.required:
                        raise
                    return StepAnswer(parent, step.config.name, box, None, exc)
            return StepAnswer(parent, step.config.name, box, outcome, None)

        tasks = [asyncio.ensure_future(one(parent, box)) for parent, box in chosen]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()


def _left(deadline: float | None) -> float | None:
    """Seconds left of the caller's deadline; DEADLINE when it passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise GatewayError(Kind.DEADLINE, "the call's deadline passed in the gateway")
    return left


def _choose(
    step: StepConfig,
    instances: Sequence[Located],
    summary: StepSummary,
    width: int,
    height: int,
) -> list[tuple[int, tuple[int, int, int, int]]]:
    """(instance id, crop box) for each instance the step looks at, in the first step's
    order; the others counted in `summary.skipped` by reason."""
    chosen: list[tuple[int, tuple[int, int, int, int]]] = []
    for index, instance in enumerate(instances):
        reason = None
        x_min, y_min, x_max, y_max = instance.box
        if step.labels is not None and instance.label not in step.labels:
            reason = "label"
        elif min(x_max - x_min, y_max - y_min) < step.min_size:
            reason = "min_size"
        elif len(chosen) >= step.max_crops:
            reason = "max_crops"
        if reason is not None:
            summary.skipped.setdefault(reason, []).append(index)
            continue
        pad_x = step.padding * (x_max - x_min)
        pad_y = step.padding * (y_max - y_min)
        box = (
            max(0, math.floor(x_min - pad_x)),
            max(0, math.floor(y_min - pad_y)),
            min(width, math.ceil(x_max + pad_x)),
            min(height, math.ceil(y_max + pad_y)),
        )
        chosen.append((index, box))
    return chosen

"""`gateway check-models`: the plan the gateway derives for every configured model.

With the gateway's own flags and model config, asks TF Serving for each model's signature
and shows, per model and version: the signature (inputs and outputs, dtype and shape), the
task, the input plan (input, form, resize, layout, scale/mean/std, channel order, encoding),
the batch plan (whether requests waiting for the model share one Predict, and why),
the output plan (which output is what, box format and coordinates, decoder) and a trial
prediction on a generated image. `--json` prints one JSON document. Exit status 1 when any
model cannot be served, with the reason. The first thing to run with a new model:

    python -m gateway check-models --upstream localhost:8500 --model-config models.toml

The gateway logs the same plans (without the trial) at startup, one line per model.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from google.protobuf import json_format
from PIL import Image

from gateway import errors, policy
from gateway.api import bindings as api
from gateway.api import pipelines
from gateway.api.task import TaskRegistry
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.core.pipeline import Pipeline
from gateway.core.plans import plan
from gateway.domain import ModelRef
from gateway.models import ModelConfigError, ModelRegistry
from gateway.models.rollout import RolloutConfig
from gateway.policy.rollout import ModelRollout
from gateway.proto.vision.v1 import model_pb2 as pb
from gateway.upstream.client import TFServingClient
from gateway.upstream.signatures import Signature

log = logging.getLogger("gateway.models")

TRIAL_SIZE = (320, 240)  # width, height of the generated trial image
TRIAL_REQUEST_ID = "check-models"


@dataclass
class ModelReport:
    """What the gateway makes of one configured model."""

    model: str
    task: str
    version: int | None = None
    signature: dict[str, Any] | None = None
    input: dict[str, object] | None = None
    outputs: dict[str, object] | None = None
    batching: dict[str, object] | None = None
    rollout: dict[str, Any] | None = None  # its canary and shadow, and their versions
    trial: dict[str, Any] | None = None
    error: str | None = None
    kind: str | None = None  # the error's errors.Kind code
    fields: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None


def _signature(signature: Signature) -> dict[str, Any]:
    return {
        "name": signature.name,
        "inputs": {k: v.describe() for k, v in sorted(signature.inputs.items())},
        "outputs": {k: v.describe() for k, v in sorted(signature.outputs.items())},
    }


def models_to_check(registry: ModelRegistry) -> list[str]:
    """Every model of the model config, the default model and the pipelines' models."""
    named = {p.detect for p in registry.pipelines.values()} | {
        step.model for p in registry.pipelines.values() for step in p.steps
    }
    return sorted({*registry.models, registry.default_model, *named})


@dataclass
class PipelineReport:
    """What the gateway makes of one configured pipeline ([pipelines.NAME])."""

    pipeline: str
    steps: list[dict[str, Any]]  # the first model, then each step: model, task, rules
    error: str | None = None
    trial: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


async def check_pipeline(
    name: str, pipeline: Pipeline, models: Mapping[str, ModelReport]
) -> PipelineReport:
    """A pipeline checked against the tasks and its models' reports, then run on the trial
    image; its error names what to change."""
    config = pipeline.registry.pipelines[name]
    registry = pipeline.registry
    steps: list[dict[str, Any]] = [
        {"step": "first", "model": config.detect, "task": registry.task_of(config.detect),
         **config.options}
    ]  # fmt: skip
    for step in config.steps:
        rules = {"labels": sorted(step.labels) if step.labels else "all",
                 "padding": step.padding, "min_size": step.min_size,
                 "max_crops": step.max_crops, "required": step.required}  # fmt: skip
        steps.append({"step": step.name, "model": step.model,
                      "task": registry.task_of(step.model), **rules, **step.options})  # fmt: skip
    report = PipelineReport(name, steps)
    try:
        cascades = Cascades(pipeline, {name: config})
    except ModelConfigError as e:
        report.error = str(e)
        return report
    bad = [m["model"] for m in steps if not models[m["model"]].ok]
    if bad:
        report.error = f"its models {', '.join(bad)} cannot be served (see their reports)"
        return report
    request = pipelines.request(trial_image(), name, {}, TRIAL_REQUEST_ID, "CheckModels", None, ())
    try:
        outcome = await cascades.run(name, request)
    except errors.GatewayError as e:
        report.error = f"the trial failed ({e.kind.code}): {e.message}"
        return report
    tree = outcome.result
    report.trial = {
        "instances": len(tree.attached),
        "steps": {s.name: {"crops": s.crops, "failed": s.failed} for s in tree.steps},
    }
    return report


def render_pipeline(report: PipelineReport) -> str:
    status = "OK" if report.ok else "CANNOT BE SERVED"
    lines = [f"pipeline '{report.pipeline}': {status}"]
    for step in report.steps:
        shown = ", ".join(f"{k} = {v}" for k, v in step.items() if k != "step")
        lines.append(f"  {step['step']}: {shown}")
    if report.trial is not None:
        lines.append(f"  trial on the generated image: {json.dumps(report.trial)}")
    if report.error is not None:
        lines.append(f"  reason: {report.error}")
    return "\n".join(lines)


async def plan_model(
    client: TFServingClient,
    registry: ModelRegistry,
    tasks: TaskRegistry,
    name: str,
    timeout: float,
) -> ModelReport:
    """The model's plan for its latest version, or the reason it cannot be served."""
    task_name = registry.task_of(name)
    report = ModelReport(name, task_name)
    config = registry.get(name, task_name)
    try:
        signature = await client.signature(ModelRef(name), timeout)
        report.version = signature.version
        report.signature = _signature(signature)
        planned = plan(tasks[task_name], signature, config)
        report.input = planned.input.describe()
        describe = getattr(planned.outputs, "describe", None)
        report.outputs = (
            describe() if callable(describe) else {"outputs": planned.outputs.output_filter}
        )
        report.batching = planned.batch.describe()
        if config.rollout is not None:
            await _plan_rollout(client, report, name, config.rollout, timeout)
    except errors.GatewayError as e:
        report.error, report.kind = e.message, e.kind.code
    return report


async def _plan_rollout(
    client: TFServingClient, report: ModelReport, name: str, rollout: RolloutConfig, timeout: float
) -> None:
    """The rollout's sides and the version TF Serving serves for each; GatewayError naming
    the side whose version or label TF Serving cannot serve."""
    described = ModelRollout(name, rollout).describe()
    sides = (("current", rollout.current), ("canary", rollout.canary), ("shadow", rollout.shadow))
    for side, target in sides:
        if target is None:
            continue
        try:
            signature = await client.signature(
                ModelRef(name, target.version, target.label), timeout
            )
        except errors.GatewayError as e:
            raise errors.GatewayError(
                e.kind, f"rollout {side} ({target.describe()}) cannot be served: {e.message}"
            ) from None
        if side == "current":
            described["current_version"] = signature.version
        else:
            described[side]["version"] = signature.version
    report.rollout = described


def trial_image() -> bytes:
    """A PNG with gradients and a few blocks: something for a model to look at."""
    width, height = TRIAL_SIZE
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    pixels[40:120, 60:160] = (220, 40, 40)
    pixels[130:200, 180:290] = (40, 60, 220)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


async def trial(pipeline: Pipeline, bindings: api.Bindings, report: ModelReport) -> None:
    """Runs the model on the trial image through the pipeline; notes the result or error."""
    binding = bindings.for_task(report.task)
    message = binding.request(trial_image(), pb.ModelSpec(name=report.model), TRIAL_REQUEST_ID)
    request = binding.to_request(message, TRIAL_REQUEST_ID, "CheckModels", None, ())
    try:
        outcome = await pipeline.run(binding.task, request)
    except errors.GatewayError as e:
        report.error = f"the trial prediction failed ({e.kind.code}): {e.message}"
        report.kind = e.kind.code
        return
    result = json_format.MessageToDict(binding.to_result(outcome), preserving_proto_field_name=True)
    report.trial = {
        "image": f"{TRIAL_SIZE[0]}x{TRIAL_SIZE[1]} PNG (generated)",
        "version": outcome.model_version,
        "summary": pipeline.tasks[binding.task].summary(outcome.result),
        "result": _first_items(result),
    }


def _first_items(result: Mapping[str, Any], count: int = 3) -> dict[str, Any]:
    """The result with its lists cut to their first items (the report shows the form)."""
    return {
        key: value[:count] if isinstance(value, list) else value
        for key, value in result.items()
        if key != "model"
    }


def log_report(report: ModelReport) -> None:
    fields = {k: v for k, v in asdict(report).items() if v is not None and k != "fields"}
    if report.ok:
        log.info("model plan", extra={"fields": fields})
    elif report.kind == errors.Kind.BAD_MODEL.code:
        log.error(
            "model cannot be served; requests for it fail with FAILED_PRECONDITION",
            extra={"fields": fields},
        )
    else:
        # TF Serving unreachable, or the model not loaded (yet): planned on its first request.
        log.warning("model plan not known yet", extra={"fields": fields})


async def log_plans(
    client: TFServingClient, registry: ModelRegistry, tasks: TaskRegistry, timeout: float
) -> None:
    """The startup log: each configured model's plan, or why it cannot be served."""
    for name in models_to_check(registry):
        log_report(await plan_model(client, registry, tasks, name, timeout))


async def refusal(
    client: TFServingClient,
    registry: ModelRegistry,
    tasks: TaskRegistry,
    name: str,
    timeout: float,
) -> str | None:
    """Why the gateway cannot serve model `name`'s current version, or None (also when
    TF Serving cannot tell: readiness sees that on its own)."""
    report = await plan_model(client, registry, tasks, name, timeout)
    return report.error if report.kind == errors.Kind.BAD_MODEL.code else None


def render(report: ModelReport) -> str:
    """The report as a person reads it."""
    version = f" version {report.version}" if report.version is not None else ""
    status = "OK" if report.ok else "CANNOT BE SERVED"
    lines = [f"model '{report.model}'{version} ({report.task}): {status}"]
    if report.signature is not None:
        sig = report.signature
        lines.append(f"  signature '{sig['name']}':")
        lines += [f"    input  {k}: {v}" for k, v in sig["inputs"].items()]
        lines += [f"    output {k}: {v}" for k, v in sig["outputs"].items()]
    plans = (
        ("input plan", report.input),
        ("output plan", report.outputs),
        ("batch plan", report.batching),
    )
    for title, shown in plans:
        if shown is not None:
            lines.append(f"  {title}: " + ", ".join(f"{k} = {v}" for k, v in shown.items()))
    if report.rollout is not None:
        lines.append(f"  rollout: {_rollout_line(report.rollout)}")
    if report.trial is not None:
        lines.append(
            f"  trial on a {report.trial['image']}: {json.dumps(report.trial['summary'])}; "
            f"{json.dumps(report.trial['result'])}"
        )
    if report.error is not None:
        lines.append(f"  reason: {report.error}")
    return "\n".join(lines)


def _rollout_line(rollout: Mapping[str, Any]) -> str:
    def served(side: Mapping[str, Any]) -> str:
        return f"{side['candidate']} (version {side['version']})"

    version = rollout.get("current_version")
    parts = [f"current = {rollout['current']}" + (f" (version {version})" if version else "")]
    if "canary" in rollout:
        canary = rollout["canary"]
        parts.append(f"canary = {served(canary)}, weight {canary['weight']:g} %, "
                     f"sticky {canary['sticky']}")  # fmt: skip
    if "shadow" in rollout:
        shadow = rollout["shadow"]
        parts.append(f"shadow = {served(shadow)}, share {shadow['share']:g}")
    return "; ".join(parts)


async def check(
    settings: Settings, registry: ModelRegistry, tasks: TaskRegistry
) -> tuple[list[ModelReport], list[PipelineReport]]:
    client = TFServingClient(settings)
    executor = ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
    try:
        pipeline = Pipeline(
            settings, client, registry, executor, tasks, policy.build(settings, registry)
        )
        reports = []
        for name in models_to_check(registry):
            report = await plan_model(client, registry, tasks, name, settings.upstream_timeout)
            if report.ok:
                await trial(pipeline, tasks.bindings, report)
            reports.append(report)
        by_model = {report.model: report for report in reports}
        cascades = [await check_pipeline(name, pipeline, by_model) for name in registry.pipelines]
        await pipeline.shadows.drain()  # a trial's copy to a shadow candidate, if any
        return reports, cascades
    finally:
        await client.close()
        executor.shutdown(wait=False)


def report(settings: Settings, registry: ModelRegistry, tasks: TaskRegistry, as_json: bool) -> int:
    """Checks every model and prints the reports; returns the exit status (1: a model
    cannot be served)."""
    reports, cascades = asyncio.run(check(settings, registry, tasks))
    ok = all(r.ok for r in reports) and all(c.ok for c in cascades)
    if as_json:
        document = {
            "upstream": settings.upstream,
            "ok": ok,
            "models": [
                {k: v for k, v in asdict(r).items() if k != "fields"} | {"ok": r.ok}
                for r in reports
            ],
            "pipelines": [asdict(c) | {"ok": c.ok} for c in cascades],
        }
        print(json.dumps(document, indent=2))
    else:
        print("\n\n".join([*(render(r) for r in reports), *map(render_pipeline, cascades)]))
        bad = [r.model for r in reports if not r.ok]
        print(
            f"\n{len(reports) - len(bad)} of {len(reports)} models can be served"
            + (f"; not: {', '.join(bad)}" if bad else "")
        )
        if cascades:
            bad = [c.pipeline for c in cascades if not c.ok]
            print(
                f"{len(cascades) - len(bad)} of {len(cascades)} pipelines can be served"
                + (f"; not: {', '.join(bad)}" if bad else "")
            )
    return 0 if ok else 1

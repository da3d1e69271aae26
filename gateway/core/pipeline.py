"""One image end to end, the same for every task and every front door.

limit -> model (a rollout may pick a canary version) and options -> deadline budget ->
signature (cached) -> input and batch plan (cached per model version and task) -> the work
priced from the image header (Task.cost) and charged to the caller's share -> request built
in a decode thread -> Predict on TF Serving, alone or batched with others waiting for the
model (gateway.core.coalescer) -> outputs mapped by the task (heavy mapping in map threads of
its own, so it never holds every decode thread) -> outcome (a copy may go to a shadow
candidate afterwards: gateway.policy.shadow).

The request's deadline travels with its work (gateway.domain.Work): checked before decoding
and mapping, and by heavy mapping between instances and strips, so late work stops within
milliseconds (DEADLINE_EXCEEDED, never a late answer); work in a thread is awaited to its end
(gateway.core.work), so the caller's slot is held as long as its work runs. Each image is
counted and logged once, whatever its outcome (gateway.core.record); failures are
GatewayError, which the front doors turn into their own status codes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import lru_cache, partial

from gateway import errors, metrics, tracing
from gateway.api.task import Task, TaskRegistry
from gateway.config import Settings
from gateway.core.coalescer import Coalescer
from gateway.core.crops import Crop, build_crop_input
from gateway.core.inputs import (
    InputMode,
    InputPlan,
    ModelInput,
    build_input,
    decodes_quickly,
    forward_encoded,
)
from gateway.core.plans import Plan, plan
from gateway.core.ports import Policy
from gateway.core.record import record
from gateway.core.work import Account, in_thread, remaining, stops
from gateway.domain import Cost, Frame, ModelRef, Outcome, OutputError, Request, Work
from gateway.errors import GatewayError, Kind
from gateway.imaging.header import ImageInfo, ImageLimits, inspect_image
from gateway.logs import BAD_OUTPUTS
from gateway.models import ModelConfig, ModelRegistry
from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs
from gateway.upstream.client import (
    StaleSignature,
    TFServingClient,
    UnreadableOutput,
    request_envelope,
)
from gateway.upstream.signatures import Signature

log = logging.getLogger("gateway.pipeline")

# Input plans kept per (model, version, task); bounded although only served versions get here.
_MAX_PLANS = 4096


def new_request_id() -> str:
    """32 random hex digits, like uuid4().hex (not a secret: it names a request in logs)."""
    return f"{random.getrandbits(128):032x}"


# Told of each image once it is answered: (task, request, request id, model called or None,
# outcome or None, failure or None, seconds in the gateway). The payload log
# (gateway.paylog) is one; an observer must return at once and never raise.
Observer = Callable[
    [str, Request, str, "ModelRef | None", "Outcome | None", "GatewayError | None", float], None
]


@lru_cache(maxsize=1024)
def _envelope(model: ModelRef, output_filter: tuple[str, ...], signature: str) -> bytes:
    return request_envelope(model, output_filter, signature)


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        client: TFServingClient,
        registry: ModelRegistry,
        executor: Executor,
        tasks: TaskRegistry,
        policy: Policy,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.tasks = tasks
        self._tasks: dict[str, Task] = dict(tasks)  # a plain dict: looked up per image
        self._client = client
        client.signature_names.update(registry.signature_names())
        self._executor = executor
        # Callers' quotas and fair shares of the concurrency limit; canary and shadow
        # versions per model (gateway.policy, built by the app).
        self.policy = policy
        self._limit = policy.limit
        self.rollouts = policy.rollouts
        self.shadows = policy.shadows
        self._image_limits = ImageLimits(settings.max_image_bytes, settings.max_pixels)
        self._plans: dict[tuple[str, int, str], Plan] = {}
        # Per-model gauges (in flight, waiting for TF Serving): the models the config names.
        named = {*registry.models, registry.default_model, *registry.task_defaults.values()}
        self._load = metrics.ModelLoad(named)
        self._coalescer = Coalescer(client, settings, executor, self._load.label)
        self.observers: list[Observer] = []
        # Heavy mapping's own threads (Task.map_in_thread; started on first use).
        self._map_threads = ThreadPoolExecutor(settings.map_threads, thread_name_prefix="map")

    def close(self) -> None:
        """Stops the map and comparison threads (the app's shutdown; the decode threads are
        the app's)."""
        self.shadows.close()
        self._map_threads.shutdown(wait=False, cancel_futures=True)

    @property
    def executor(self) -> Executor:
        """The decode threads."""
        return self._executor

    @property
    def in_flight(self) -> int:
        return self._limit.in_flight

    def admits(self, caller: str) -> None:
        """OVERLOADED if the limit would refuse `caller` now, taking nothing (before a body)."""
        self._limit.check(caller)

    def admit(self, caller: str) -> Account:
        """`caller`'s admission to the gateway's limit for one call (OVERLOADED when it is
        refused), charged per image the call runs; release() it when the call is done."""
        return Account(self._limit, caller)

    async def run(
        self,
        task_name: str,
        request: Request,
        *,
        account: Account | None = None,
        pixels: Crop | None = None,
        observe: bool = True,
    ) -> Outcome:
        """Runs `task_name` on one image; raises GatewayError on failure. A cascade
        (gateway.core.cascade) runs its images under its own `account`, on `pixels` it has
        decoded instead of `request.image`, and has its steps' crops seen by no observer."""
        task = self._tasks[task_name]
        started = time.perf_counter()
        timings = {"decode": 0.0, "upstream": 0.0}
        notes: dict[str, object] = {}  # for the request log line
        request_id = request.request_id or new_request_id()
        code = "OK"
        model: ModelRef | None = None
        outcome: Outcome | None = None
        failure: GatewayError | None = None
        metrics.start()
        try:
            admitted = account or Account(self._limit, request.caller)
            work = Work()
            try:
                model = self.model_ref(task.name, request.model)
                model, shadowed = self.rollouts.route(model, request.caller, request_id)
                with self._load.in_flight(model.name):
                    outcome = await self._run(
                        task, model, request, request_id, timings, notes, work,
                        partial(admitted.charge, work=work), pixels,
                    )  # fmt: skip
            finally:
                if account is None:
                    admitted.release()
            if shadowed is not None:  # the copy gets what is left of the caller's deadline
                left = None if work.deadline is None else work.deadline - time.monotonic()
                copy = request if left is None else request._replace(timeout=max(left, 1e-3))
                self.shadows.send(shadowed, outcome, partial(
                    self._run, task, shadowed.shadow, copy, request_id, timings.copy(), {}, Work(),
                    None, pixels,
                ), task.compare)  # fmt: skip
            return outcome
        except GatewayError as exc:
            code, failure = exc.code, exc
            raise
        except asyncio.CancelledError:
            code = Kind.CANCELLED.code
            failure = GatewayError(Kind.CANCELLED, "the call was cancelled")
            raise
        except Exception:
            code = Kind.INTERNAL.code
            log.exception("unexpected error", extra={"fields": {"request_id": request_id}})
            failure = errors.internal(request_id)
            raise failure from None
        finally:
            total = time.perf_counter() - started
            record(task, request, code, request_id, model, outcome, timings, total, notes)
            if observe:
                for observe_one in self.observers:
                    observe_one(task.name, request, request_id, model, outcome, failure, total)

    def model_ref(self, task: str, requested: ModelRef) -> ModelRef:
        """The model to call for `task` (a task name): the request's, or the task's default;
        INVALID_INPUT when the version or label is malformed or no model is named and none is
        configured."""
        if requested.version is not None and requested.version <= 0:
            raise errors.invalid_input(
                f"model.version must be a positive version number, got {requested.version}; "
                "leave it unset for the latest version"
            )
        if requested.label is not None and not requested.label:
            raise errors.invalid_input(
                "model.label is set but empty; leave it unset or name a label"
            )
        if requested.name:
            return requested
        default = self.registry.default_for(task)
        if default is None:
            raise errors.invalid_input(
                f"the request names no model and the gateway has no default {task} "
                f"model; name one in model.name, or set [defaults] {task} in the model "
                "config (GATEWAY_MODEL_CONFIG)"
            )
        return ModelRef(default, requested.version, requested.label)

    @property
    def default_model(self) -> str:
        """The gateway's default model (--model, or the model config's default_model)."""
        return self.registry.default_model

    def default_task(self) -> str:
        """The default model's task: the one `/invocations`-style calls that name no task
        run (a model the config does not list has the config's default task)."""
        return self.registry.task_of(self.registry.default_model)

    async def model_status(self, model: ModelRef) -> tfs.GetModelStatusResponse:
        """TF Serving's status of the model's versions (all, or the one named); GatewayError
        INVALID_INPUT for a version that is not positive, NOT_FOUND for an unknown model."""
        if model.version is not None and model.version <= 0:
            raise errors.invalid_input(f"version must be a positive integer, got {model.version}")
        return await self._client.model_status(model, self.settings.upstream_timeout)

    async def check(self, task_name: str, request: Request) -> None:
        """Raises the GatewayError every image like `request` would (batch job admission,
        before a job exists): its model configured for the task, its options, the signature."""
        task = self._tasks[task_name]
        model = self.model_ref(task.name, request.model)
        config = self._config(task, model)
        task.resolve(request.options, config, config.rules(self.settings))
        signature = await self._client.signature(model, self._timeout(None), request.trace)
        self._plan(task, signature, config)

    def _config(self, task: Task, model: ModelRef) -> ModelConfig:
        config = self.registry.get(model.name, task.name)
        if config.task != task.name:
            raise errors.bad_model(
                f"model '{model.name}' is configured as a {config.task} model (model config), "
                f"not for {task.name}; call the {config.task} API for it"
            )
        return config

    def _timeout(self, deadline: float | None) -> float:
        """Seconds left for a TF Serving call: the caller's deadline, capped by ours."""
        return remaining(deadline, self.settings.upstream_timeout)

    def _plan(self, task: Task, signature: Signature, config: ModelConfig) -> Plan:
        key = (signature.model, signature.version, task.name)
        found = self._plans.get(key)
        if found is None:
            found = plan(task, signature, config)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[key] = found
        return found

    async def _build_input(
        self,
        image: bytes | Crop,
        plan: InputPlan,
        envelope: bytes,
        timings: dict[str, float],
        work: Work,
        info: ImageInfo | None,
    ) -> ModelInput:
        started = time.perf_counter()
        try:
            if isinstance(image, Crop):  # a pipeline's: decoded already
                return await in_thread(self._executor, work, build_crop_input, image, plan,
                                       envelope)  # fmt: skip
            if plan.mode is InputMode.ENCODED:
                # Forwarding the caller's bytes needs only their header: no thread hop.
                forwarded = forward_encoded(image, plan, envelope, self._image_limits, info)
                if forwarded is not None:
                    return forwarded
            elif self._limit.in_flight == 1 and decodes_quickly(image, plan, self._image_limits):
                # Nothing else in flight: decoding a small JPEG here is quicker than the hop
                # to a decode thread and back, and there is nothing the loop would do meanwhile.
                return build_input(image, plan, envelope, self._image_limits)
            return await in_thread(
                self._executor, work, build_input, image, plan, envelope, self._image_limits
            )
        finally:
            timings["decode"] += time.perf_counter() - started

    async def _run(
        self,
        task: Task,
        model: ModelRef,
        request: Request,
        request_id: str,
        timings: dict[str, float],
        notes: dict[str, object],
        work: Work,
        charge: Callable[[Cost], None] | None = None,
        pixels: Crop | None = None,
    ) -> Outcome:
        config = self._config(task, model)
        options = task.resolve(request.options, config, config.rules(self.settings))
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        work.deadline = deadline
        info = None  # the image's header, read once: for its price and for its input
        for attempt in (1, 2):
            signature = self._client.signatures.known(model) or await self._client.signature(
                model, self._timeout(deadline), request.trace
            )
            plan = self._plan(task, signature, config)
            if charge is not None:
                # Priced before any of it runs: the image's size from its header (microseconds),
                # the plan and the options; charged to the caller's share of the gateway's work.
                if pixels is None:
                    info = inspect_image(request.image, self._image_limits)
                    size = Frame(info.width, info.height)
                else:
                    size = Frame(pixels.pixels.shape[1], pixels.pixels.shape[0])
                charge(task.cost(options, size, plan.outputs, config))
                charge = None
            envelope = _envelope(model, plan.outputs.output_filter, signature.name)
            self._timeout(deadline)  # nothing is decoded for a caller whose deadline passed
            with tracing.span("decode", request.trace, model=model.name):
                model_input = await self._build_input(
                    request.image if pixels is None else pixels, plan.input, envelope, timings,
                    work, info,
                )  # fmt: skip
            started = time.perf_counter()
            try:
                with (
                    tracing.span("upstream", request.trace, model=model.name) as trace,
                    self._load.queued(model.name),
                ):
                    answer = await self._coalescer.predict(
                        model, plan.batch, envelope, plan.input.key, model_input, deadline,
                        trace, request_id,
                    )  # fmt: skip
                break
            except StaleSignature:
                if attempt == 2:
                    raise
            except UnreadableOutput as exc:
                BAD_OUTPUTS.report(exc.model, exc.version, exc.problem)
                raise
            finally:
                timings["upstream"] += time.perf_counter() - started
        frame = Frame(
            model_input.width, model_input.height, model_input.transform, model_input.sent, work
        )
        if answer.batch > 1:
            # The images of one call share its lead's request id (whose trace went upstream).
            notes["batch"] = {"size": answer.batch, "lead": answer.lead,
                              "queue_ms": round(answer.waited * 1000, 2)}  # fmt: skip
        try:
            with stops():  # Stopped (deadline, caller gone) -> DEADLINE_EXCEEDED, CANCELLED
                work.check()
                if task.map_in_thread:
                    result = await in_thread(
                        self._map_threads, work, task.map, answer.outputs, plan.outputs, frame,
                        options, config,
                    )  # fmt: skip
                else:
                    result = task.map(answer.outputs, plan.outputs, frame, options, config)
                work.check()  # a caller past its deadline gets DEADLINE_EXCEEDED, not an answer
        except OutputError as exc:
            BAD_OUTPUTS.report(model.name, answer.version, str(exc))
            raise errors.bad_model(
                f"model '{model.name}' version {answer.version} gave unusable outputs: {exc}"
            ) from None
        return Outcome(
            result=result,
            image_width=model_input.width,
            image_height=model_input.height,
            model_name=model.name,
            model_version=answer.version,
            request_id=request_id,
            timings=timings,
        )

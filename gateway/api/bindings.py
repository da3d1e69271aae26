"""What a binding is: the only place where a front door, or the client, learns about a task.
Each task's binding lives in its folder (gateway/tasks/<task>/binding.py).

A binding names the task (as the task registry and the model config do), its gRPC service with
its unary and streaming RPCs, its request and result messages, the HTTP route's verb
(`/v1/models/{model}:detect`) and what OpenAPI and the command line say about its options;
and it converts: `to_request` makes the pipeline's plain Request from the request message
(the options its `options` name, as its task's options type),
`to_result` the result message from the pipeline's Outcome. The gRPC servicers, the HTTP door,
OpenAPI, the client and the batch runner loop over the bindings.

A task folder declares its binding with `Binding.of`: its proto file says the RPCs and the
messages, the folder holds the page (page.js) and the drawing (drawing.py), the options type
each option's help, and the task gives what is its own (how its result fills the result
message, what a call does).

Every task's messages follow one shape, which the doors rely on: the request has `bytes
image`, `vision.v1.ModelSpec model`, `string request_id` and scalar options; the result
has `int32 image_width`, `int32 image_height`, `vision.v1.ServedModel model`, `string
request_id` and `google.rpc.Status error` (a stream's per-image error).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from operator import attrgetter
from pathlib import Path
from typing import Any, get_type_hints

from google.protobuf.descriptor import FileDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from gateway import errors
from gateway.domain import ModelRef, Outcome, Request, Trace
from gateway.proto.vision.v1 import model_pb2 as pb

# Caller headers (gRPC metadata, HTTP headers) passed on to TF Serving, so traces connect
# through the gateway.
TRACE_HEADERS = frozenset(
    {
        "traceparent",
        "tracestate",
        "x-request-id",
        "b3",
        "x-b3-traceid",
        "x-b3-spanid",
        "x-b3-parentspanid",
        "x-b3-sampled",
        "x-b3-flags",
    }
)
# (request message, request id, method name for logs and metrics, seconds left or None, trace)
ToRequest = Callable[[Any, str, str, "float | None", Trace], Request]
# (result message, the task's result): sets the task's own fields of a result message
FillResult = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Binding:
    """A task's public API."""

    task: str  # the task's name in the task registry and in the model config
    verb: str  # the HTTP route's verb (`:detect`), the client's and batch jobs' task name
    service: ServiceDescriptor  # the gRPC service
    unary: str  # its one-image RPC ("Detect")
    stream: str  # its streaming RPC ("DetectStream")
    request_type: type[Message]
    result_type: type[Message]
    # The task's options type (a NamedTuple), made from the request's option fields: its
    # fields are `options`' names, in that order.
    options_type: Callable[..., Any]
    fill_result: FillResult  # the task's own fields of a result message (to_result)
    summary: str  # what a call does, for OpenAPI ("Detect objects")
    # The request's options (scalar fields besides request_id), each with its description.
    options: Mapping[str, str]
    # JavaScript drawing a result on the page: its task folder's page.js (Binding.of), the
    # body of an async (result, view) function (gateway/frontends/http/page.py: the contract).
    # "" for none: the page then shows the JSON only.
    page: str = ""
    # The client's `--draw`: draws a result (as JSON-ready data) on a gateway.imaging.sketch
    # Sketch; its task folder's drawing.py (Binding.of). None: the task draws nothing.
    draw: Callable[[Any, Mapping[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        names = tuple(self.options)
        fields = getattr(self.options_type, "_fields", names)
        if tuple(fields) != names:
            raise ValueError(
                f"binding {self.verb}: its options type's fields {fields} are not its "
                f"options {names}"
            )
        # The option fields of a request message, as a tuple (attrgetter gives one name's
        # value bare): read per request, so made once.
        read = (
            attrgetter(*names) if len(names) > 1 else lambda m: tuple(getattr(m, n) for n in names)
        )
        object.__setattr__(self, "_read_options", read)

    @classmethod
    def of(
        cls,
        proto: FileDescriptor,
        options_type: Callable[..., Any],
        fill_result: FillResult,
        *,
        summary: str,
        task: str = "",
        verb: str = "",
    ) -> Binding:
        """A task's binding from its proto file (`<task>_pb2.DESCRIPTOR`) and its task folder
        (the package of the module defining `fill_result`, which sets the task's own fields
        of a result message). From the proto file's one service: the unary and the streaming
        RPC and their messages; the verb is the unary RPC's name in lower case unless given.
        From the folder: the task's name (unless given), the page (page.js) and the client's
        --draw (drawing.py's `draw`), each optional. Each option's help is its field's in
        `options_type` (`Annotated[float, "minimum score, 0..1"]`)."""
        services = list(proto.services_by_name.values())
        if len(services) != 1:
            raise ValueError(f"{proto.name} has {len(services)} services; a task's proto has one")
        (service,) = services
        unary = _method(service, streaming=False)
        stream = _method(service, streaming=True)
        package = fill_result.__module__.rpartition(".")[0]
        page = resources.files(package) / "page.js"
        drawing = f"{package}.drawing"
        hints = get_type_hints(options_type, include_extras=True)
        return cls(
            task=task or package.rpartition(".")[2],
            verb=verb or unary.name.lower(),
            service=service,
            unary=unary.name,
            stream=stream.name,
            request_type=GetMessageClass(unary.input_type),
            result_type=GetMessageClass(unary.output_type),
            options_type=options_type,
            fill_result=fill_result,
            summary=summary,
            options={name: option_help(options_type, name, hint) for name, hint in hints.items()},
            page=page.read_text(encoding="utf-8") if page.is_file() else "",
            draw=(
                importlib.import_module(drawing).draw
                if importlib.util.find_spec(drawing) is not None
                else None
            ),
        )

    @property
    def service_name(self) -> str:
        return str(self.service.full_name)

    def to_request(
        self, message: Any, request_id: str, method: str, timeout: float | None, trace: Trace
    ) -> Request:
        """The pipeline's Request from a request message: its image, model and options
        (`options_type` made from the fields `options` names); `method` names the call in
        metrics and logs, `timeout` is the seconds left (None: no deadline)."""
        options = self.options_type(*self._read_options(message))  # type: ignore[attr-defined]
        return Request(
            message.image, to_model_ref(message.model), options, request_id, timeout, method, trace
        )

    def to_result(self, outcome: Outcome) -> Any:
        """The result message of an Outcome: the fields every result has (image size, served
        model, request id), then the task's own (`fill_result`)."""
        result = self.result_type(
            image_width=outcome.image_width,
            image_height=outcome.image_height,
            model=served_model(outcome),
            request_id=outcome.request_id,
        )
        self.fill_result(result, outcome.result)
        return result

    def served(self, message: Any) -> pb.ServedModel:
        """The model that answered, from a result message."""
        return message.model

    def check_options(self, options: Mapping[str, Any]) -> None:
        """GatewayError INVALID_INPUT naming an option this task does not have (never
        dropped) or a value its field cannot hold; what a value means is the task's to check
        (Task.resolve)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise errors.invalid_input(
                f"{', '.join(unknown)} is not an option of task {self.verb} (its options: "
                f"{', '.join(self.options) or 'none'})"
            )
        try:
            self.request_type(**options)
        except (TypeError, ValueError) as e:
            raise errors.invalid_input(f"options {dict(options)}: {e}") from None

    def request(self, image: bytes, model: pb.ModelSpec, request_id: str, **options: Any) -> Any:
        """A request message (for clients: the batch runner, the command line); protobuf's
        ValueError or TypeError for an option it does not have (check_options first where a
        caller's options are judged)."""
        return self.request_type(image=image, model=model, request_id=request_id, **options)


class Bindings:
    """The bindings a gateway serves, looked up by task or by verb."""

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self._all = tuple(bindings)
        self._by_task = {binding.task: binding for binding in self._all}
        self._by_verb = {binding.verb: binding for binding in self._all}
        if len(self._by_task) != len(self._all) or len(self._by_verb) != len(self._all):
            raise ValueError("two bindings share a task or a verb")

    def __iter__(self) -> Iterator[Binding]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def for_task(self, task: str) -> Binding:
        """KeyError when no binding serves `task`."""
        return self._by_task[task]

    def for_verb(self, verb: str) -> Binding:
        """KeyError when no binding has `verb`."""
        return self._by_verb[verb]

    @property
    def verbs(self) -> tuple[str, ...]:
        return tuple(self._by_verb)


def page_script(binding_module: str) -> str:
    """The page renderer beside a binding module (`page_script(__file__)`): the page.js of its
    task folder."""
    return (Path(binding_module).parent / "page.js").read_text(encoding="utf-8")


def option_help(options_type: Any, name: str, hint: Any) -> str:
    """An option's help: the text its field's Annotated type carries."""
    texts = [text for text in getattr(hint, "__metadata__", ()) if isinstance(text, str)]
    if not texts:
        raise ValueError(
            f'{options_type.__name__}.{name} has no help: annotate it Annotated[type, "help"]'
        )
    return texts[0]


def _method(service: ServiceDescriptor, *, streaming: bool) -> MethodDescriptor:
    """The service's one unary RPC, or its one RPC streaming both ways."""
    found = [
        method
        for method in service.methods
        if method.client_streaming == method.server_streaming == streaming
    ]
    if len(found) != 1:
        kind = "streaming" if streaming else "unary"
        raise ValueError(f"service {service.full_name} has {len(found)} {kind} RPCs, not one")
    return found[0]


# --- conversions shared by the bindings -------------------------------------------------


def to_model_ref(spec: pb.ModelSpec) -> ModelRef:
    choice = spec.WhichOneof("version_choice")
    return ModelRef(
        name=spec.name,
        version=spec.version if choice == "version" else None,
        label=spec.label if choice == "label" else None,
    )


def served_model(outcome: Outcome) -> pb.ServedModel:
    return pb.ServedModel(name=outcome.model_name, version=outcome.model_version)


def model_spec(
    model: str = "", version: int | None = None, label: str | None = None
) -> pb.ModelSpec:
    spec = pb.ModelSpec(name=model)
    if version is not None and label is not None:
        raise ValueError("give a version or a label, not both")
    if version is not None:
        spec.version = version
    elif label is not None:
        spec.label = label
    return spec

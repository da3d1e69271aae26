"""The HTTP door's routes: every path, method and handler, in one table.

    POST /v1/models/{model}[/versions/{n} | /labels/{label}]:{verb}   one per binding
                               (:detect, :classify)
    POST /v1/pipelines/{name}:run   a pipeline: detect, then a model on each crop
    POST /invocations          the default model with its task (SageMaker-style hosting), or
                               ?pipeline=NAME
    GET  /ping                 200 {} while the default model is AVAILABLE, else 503
    GET  /v1/models/{model}[/versions/{n} | /labels/{label}]   TF Serving's model status
    GET  /v1/models/{model}/rollout   the model's canary and shadow, and what they counted
    GET  /openapi.json, GET /  (the description, and a page to try the API in a browser)

    Batch jobs (gateway.frontends.http.job_handlers):
    POST /v1/uploads, POST /v1/batchJobs, GET /v1/operations, GET|DELETE /v1/operations/{id},
    POST /v1/operations/{id}:cancel | :wait, GET /v1/operations/{id}/results

gateway.frontends.http.openapi describes the same routes (a test checks they agree).
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from gateway.api.bindings import Bindings
from gateway.frontends.http.handlers import Handlers
from gateway.frontends.http.job_handlers import JobHandlers

# Path segments: anything but "/" and ":" (the ":detect" verb follows the model name).
SEGMENT = "[^/:]+"
MODEL = f"/v1/models/{{model:{SEGMENT}}}"
# The model path's three forms: latest version, a version, a version label.
MODEL_PATHS = (
    MODEL,
    f"{MODEL}/versions/{{version:{SEGMENT}}}",
    f"{MODEL}/labels/{{label:{SEGMENT}}}",
)


OPERATION = f"/v1/operations/{{id:{SEGMENT}}}"


def register_routes(
    app: web.Application, handlers: Handlers, bindings: Bindings, jobs: JobHandlers | None
) -> None:
    """Adds every route of the door to `app` (the jobs routes when there is a jobs service)."""
    add = app.router.add_route
    for binding in bindings:
        predict = partial(handlers.predict, binding)
        expect = partial(handlers.expect, f"POST :{binding.verb}")
        for path in MODEL_PATHS:
            add("POST", f"{path}:{binding.verb}", predict, expect_handler=expect)
    add(
        "POST",
        f"/v1/pipelines/{{pipeline:{SEGMENT}}}:run",
        handlers.pipeline,
        expect_handler=partial(handlers.expect, "POST :run"),
    )
    add(
        "POST",
        "/invocations",
        handlers.invocations,
        expect_handler=partial(handlers.expect, "POST /invocations"),
    )
    add("GET", "/ping", handlers.ping)
    for path in MODEL_PATHS:
        add("GET", path, handlers.model_status)
    add("GET", f"{MODEL}/rollout", handlers.rollout)
    add("GET", "/openapi.json", handlers.openapi)
    add("GET", "/", handlers.page)
    if jobs is not None:
        add("POST", "/v1/uploads", jobs.upload)
        add("POST", "/v1/batchJobs", jobs.create)
        add("GET", "/v1/operations", jobs.list_operations)
        add("GET", OPERATION, jobs.get)
        add("DELETE", OPERATION, jobs.delete)
        add("POST", f"{OPERATION}:cancel", jobs.cancel)
        add("POST", f"{OPERATION}:wait", jobs.wait)
        add("GET", f"{OPERATION}/results", jobs.results)

"""The HTTP door's routes: every path, method and handler, in one table.

    POST /v1/models/{model}[/versions/{n} | /labels/{label}]:{verb}   one per binding
                               (:detect, :classify)
    POST /invocations          the default model with its task (SageMaker-style hosting)
    GET  /ping                 200 {} while the default model is AVAILABLE, else 503
    GET  /v1/models/{model}[/versions/{n} | /labels/{label}]   TF Serving's model status
    GET  /openapi.json, GET /  (the description, and a page to try the API in a browser)

gateway.frontends.http.openapi describes the same routes (a test checks they agree).
"""

from __future__ import annotations

from functools import partial

from aiohttp import web

from gateway.frontends.api import Bindings
from gateway.frontends.http.handlers import Handlers

# Path segments: anything but "/" and ":" (the ":detect" verb follows the model name).
SEGMENT = "[^/:]+"
MODEL = f"/v1/models/{{model:{SEGMENT}}}"
# The model path's three forms: latest version, a version, a version label.
MODEL_PATHS = (
    MODEL,
    f"{MODEL}/versions/{{version:{SEGMENT}}}",
    f"{MODEL}/labels/{{label:{SEGMENT}}}",
)


def register_routes(app: web.Application, handlers: Handlers, bindings: Bindings) -> None:
    """Adds every route of the door to `app`."""
    add = app.router.add_route
    for binding in bindings:
        predict = partial(handlers.predict, binding)
        expect = partial(handlers.expect, f"POST :{binding.verb}")
        for path in MODEL_PATHS:
            add("POST", f"{path}:{binding.verb}", predict, expect_handler=expect)
    add(
        "POST",
        "/invocations",
        handlers.invocations,
        expect_handler=partial(handlers.expect, "POST /invocations"),
    )
    add("GET", "/ping", handlers.ping)
    for path in MODEL_PATHS:
        add("GET", path, handlers.model_status)
    add("GET", "/openapi.json", handlers.openapi)
    add("GET", "/", handlers.page)

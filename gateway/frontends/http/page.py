"""GET /: one self-contained page to try the API in a browser.

Pick an image and a model: the page posts the image to the model's task route
(`/v1/models/{model}:{verb}`) with the options filled in (an input for each of the task's
request options: `Binding.options`, typed from the request message), draws the image, then
hands the JSON result to the renderer of that task, which draws over the image and lists what
it found; the raw JSON is shown below. No external scripts, styles or fonts (clusters may
have no internet). `/?image=<url>&model=<name>&<option>=<value>` runs at once on that image (a
small data: URL works), and `document.body.dataset.state` ends as `done` or `error`: how the
browser tests drive it.

The page knows no task. Each task's binding carries its renderer (`Binding.page`), read from
the task folder's page.js (gateway/tasks/<task>/page.js, which `Binding.of` reads). The
contract of a page.js:

- It is the BODY of an async function registered for the binding's verb:
      RENDERERS["<verb>"] = async (result, view) => { <page.js> };
  called once per result with `result`, the parsed JSON of the HTTP door's answer (proto
  field names: `result.model.name`, `result.image_width`, ...), after the image is drawn.
  Functions and constants it declares stay local to it; it may `await` (e.g. to decode a
  PNG). What it throws is shown as the status line in red and ends the run as `error`.
- `view` offers (gateway/frontends/http/page.js, makeView):
    ctx            the canvas 2D context, scaled so that (x, y) are pixels of the image as the
                   result names them (0..image_width, 0..image_height; EXIF orientation applied)
    width, height  the image's size in those pixels
    line, size     a stroke width and a font size suited to the image
    list           an empty <ol> below the canvas for text rows; row(text) appends one
    status(text)   sets the status line (the run ends `done` once the renderer returns)
    served(result) "NAME version V", the model that answered
    colour(i)      the i-th colour of a palette of distinct colours (BOX for i = 0)
    drawBox(box, text, colour)    box = {x_min, y_min, x_max, y_max}: its outline inside the
                                  box, and `text` on a label at its top-left corner if given
    drawLabel(text, x, y, colour) a label (white text on `colour`) above (x, y), or below it
                                  at the image's top edge
    drawPoint(x, y, colour)       a filled dot with a white rim
    drawLine(x0, y0, x1, y1, colour)
    paintMask(bits, width, height, colour)  a translucent overlay where bits[y * width + x]
                                  is non-zero: a row-major mask of the whole image (a mask of
                                  another size is stretched over the image)
- It must not contain `</script` (refused at startup: the page inlines it).

A binding without a page.js gets the generic renderer: the status line names the model and the
JSON, pretty-printed, is all there is to see.

The gateway's pipelines ([pipelines.NAME], docs/pipelines.md) are in the same picker: the page
posts the image to `/v1/pipelines/{name}:run` with the run's options, draws the first step's
answer with its task's renderer, and under each instance's label a caption of each result the
steps attached to it (`colour: red 0.97`, a failed crop's code). `/?pipeline=<name>&image=...`
runs one at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from gateway.api.bindings import Binding, Bindings
from gateway.api.pipelines import FIRST, STEP, answer_bindings, instances_field
from gateway.api.pipelines import OPTIONS as RUN_OPTIONS
from gateway.core.cascade import Cascade
from gateway.models import ModelRegistry
from gateway.proto.pipeline.v1.pipeline_pb2 import RunRequest

# Boxes are drawn in this colour (the first colour of the palette); the browser tests look for
# it in screenshots.
BOX_COLOUR = "#ff00ff"
# The page's own script (after the constants below and the renderers): the model picker, the
# call, the view the renderers draw with.
SCRIPT = (Path(__file__).parent / "page.js").read_text(encoding="utf-8")
# The batch jobs view (with jobs): its HTML and its script, after the page's own.
JOBS_HTML = (Path(__file__).parent / "jobs_page.html").read_text(encoding="utf-8")
JOBS_SCRIPT = (Path(__file__).parent / "jobs_page.js").read_text(encoding="utf-8")

_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Vision gateway</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
  form { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; margin-bottom: 12px; }
  canvas { display: block; max-width: 100%; border: 1px solid #ccc; }
  #status { margin: 8px 0; }
  #status.error { color: #b00020; }
  pre { background: #f4f4f4; padding: 8px; overflow: auto; max-height: 40em; }
  ol { margin: 8px 0; }
  #options { display: contents; }
  #options input { width: 7em; }
</style>
</head>
<body data-state="idle">
<h1>Vision gateway</h1>
<form id="form">
  <label>Image <input type="file" id="file" accept="image/*"></label>
  <label>Model <select id="model"></select></label>
  <span id="options"></span>
</form>
<div id="status">Pick an image.</div>
<canvas id="canvas" width="0" height="0"></canvas>
<ol id="rows"></ol>
<pre id="raw"></pre>
"""

_SCRIPT_END = re.compile(r"</script", re.IGNORECASE)


def _script_json(value: object) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _kind(field_type: int) -> str:
    if field_type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return "number"
    if field_type == FieldDescriptor.TYPE_STRING:
        return "text"
    if field_type == FieldDescriptor.TYPE_ENUM:
        return "choice"
    return "integer"


def options(binding: Binding) -> list[dict[str, object]]:
    """The inputs of a task's request options, for the page: name, kind (number, integer,
    text, choice), description, and an enum's choices as [number, name] (its zero value is the
    input left empty: the model's default)."""
    return _inputs(binding.request_type.DESCRIPTOR, binding.options)


def pipelines(
    cascades: Mapping[str, Cascade], bindings: Iterable[Binding]
) -> dict[str, dict[str, object]]:
    """Each pipeline as the page shows it: its first model, the route verb of that model's task
    (whose renderer draws the first answer), its steps' names and models, and the inputs of a
    run's options (the first model's, described as its task describes them)."""
    by_task = {binding.task: binding for binding in bindings}
    shown: dict[str, dict[str, object]] = {}
    for name, cascade in sorted(cascades.items()):
        first = by_task[cascade.first.name]
        described = {option: first.options.get(option, option) for option in RUN_OPTIONS}
        shown[name] = {
            "detect": cascade.config.detect,
            "verb": first.verb,
            "steps": [{"name": s.config.name, "model": s.config.model} for s in cascade.steps],
            "options": _inputs(RunRequest.DESCRIPTOR, described),
        }
    return shown


def answers(bindings: Iterable[Binding]) -> dict[str, object]:
    """Where a pipeline's answer (as JSON) holds the tasks' own answers: `first`, each field of
    PipelineResult's `first` oneof -> [the verb of its task, the field listing its instances
    (the repeated message with a box)]; `steps`, the fields of StepResult's `result` oneof."""
    found = answer_bindings(FIRST, Bindings(bindings))
    first = {name: [b.verb, instances_field(b)] for name, b in found.items()}
    return {"first": first, "steps": [field.name for field in STEP.fields]}


def _inputs(request: Any, described: Mapping[str, str]) -> list[dict[str, object]]:
    """`request`: the request message's descriptor."""
    fields = request.fields_by_name
    inputs: list[dict[str, object]] = []
    for name, description in described.items():
        field = fields[name]
        entry: dict[str, object] = {
            "name": name,
            "kind": _kind(field.type),
            "description": description,
        }
        if field.enum_type is not None:
            entry["choices"] = [[v.number, v.name] for v in field.enum_type.values if v.number]
        inputs.append(entry)
    return inputs


def renderers(bindings: Iterable[Binding]) -> str:
    """`RENDERERS[verb] = async (result, view) => {...};` for each binding with a page script.
    ValueError when a script would end the page's <script> element."""
    parts = ["const RENDERERS = {};"]
    for binding in bindings:
        if not binding.page.strip():
            continue
        if _SCRIPT_END.search(binding.page):
            raise ValueError(
                f"the page script of the {binding.task} binding contains '</script': "
                "the page inlines it; write '<\\/script' in a string instead"
            )
        parts.append(
            f"// {binding.task}\nRENDERERS[{_script_json(binding.verb)}] = "
            f"async (result, view) => {{\n{binding.page.rstrip()}\n}};"
        )
    return "\n".join(parts)


def render(
    registry: ModelRegistry,
    bindings: Iterable[Binding],
    jobs: bool = False,
    cascades: Mapping[str, Cascade] | None = None,
) -> str:
    """The page, with each model's task, each task's route verb (`detect`, ...) and renderer,
    and the pipelines (`cascades`, the gateway's checked [pipelines]); `jobs`: with the batch
    jobs view (jobs_page.html, jobs_page.js)."""
    bindings = tuple(bindings)
    models = {name: registry.task_of(name) for name in {registry.default_model, *registry.models}}
    constants = (
        f"const MODELS = {_script_json(dict(sorted(models.items())))};\n"
        f"const VERBS = {_script_json({b.task: b.verb for b in bindings})};\n"
        f"const OPTIONS = {_script_json({b.verb: options(b) for b in bindings})};\n"
        f"const PIPELINES = {_script_json(pipelines(cascades or {}, bindings))};\n"
        f"const ANSWERS = {_script_json(answers(bindings))};\n"
        f"const DEFAULT_MODEL = {_script_json(registry.default_model)};\n"
        f"const BOX = {_script_json(BOX_COLOUR)};\n"
    )
    return "".join(
        (
            _HEAD,
            JOBS_HTML if jobs else "",
            '<script>\n"use strict";\n',
            constants,
            renderers(bindings),
            "\n",
            SCRIPT,
            JOBS_SCRIPT if jobs else "",
            "</script>\n</body>\n</html>\n",
        )
    )

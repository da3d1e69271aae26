"""GET /: one self-contained page to try the API in a browser.

Pick an image and a model: the page posts the image to the model's `:detect` or `:classify`
route and draws the boxes with labels and scores over the image (or lists the top classes),
with the raw JSON below. No external scripts, styles or fonts (clusters may have no
internet). `/?image=<url>&model=<name>` runs at once on that image (a small data: URL works), and
`document.body.dataset.state` ends as `done` or `error`: how the browser test drives it.
"""

from __future__ import annotations

import json

from gateway.api.bindings import Bindings
from gateway.frontends.http import jobs_page
from gateway.models import ModelRegistry

# Boxes are drawn in this colour; the browser test looks for it in the screenshot.
BOX_COLOUR = "#ff00ff"

_PAGE = """<!doctype html>
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
</style>
</head>
<body data-state="idle">
<h1>Vision gateway</h1>
<form id="form">
  <label>Image <input type="file" id="file" accept="image/*"></label>
  <label>Model <select id="model"></select></label>
  <label>Min score <input type="number" id="min_score" min="0" max="1" step="0.05"
    placeholder="model default"></label>
</form>
<div id="status">Pick an image.</div>
<canvas id="canvas" width="0" height="0"></canvas>
<ol id="classes"></ol>
<pre id="raw"></pre>
__JOBS_HTML__<script>
"use strict";
const MODELS = __MODELS__;
const VERBS = __VERBS__;
const DEFAULT_MODEL = __DEFAULT__;
const BOX = "__BOX__";
const $ = (id) => document.getElementById(id);
const select = $("model");
for (const [name, task] of Object.entries(MODELS)) {
  const option = document.createElement("option");
  option.value = name;
  option.textContent = name + " (" + task + ")";
  option.selected = name === DEFAULT_MODEL;
  select.appendChild(option);
}
function status(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}
function drawLabel(ctx, text, x, y, size) {
  ctx.font = size + "px sans-serif";
  const width = ctx.measureText(text).width + 6;
  const top = y - size - 4 >= 0 ? y - size - 4 : y;
  ctx.fillStyle = BOX;
  ctx.fillRect(x, top, width, size + 4);
  ctx.fillStyle = "#ffffff";
  ctx.textBaseline = "top";
  ctx.fillText(text, x + 3, top + 2);
}
async function run(blob) {
  document.body.dataset.state = "running";
  const model = select.value;
  const verb = VERBS[MODELS[model]];
  const params = new URLSearchParams();
  if ($("min_score").value) params.set("min_score", $("min_score").value);
  status("Running " + model + " ...");
  $("classes").textContent = "";
  try {
    const response = await fetch(
      "/v1/models/" + encodeURIComponent(model) + ":" + verb + "?" + params,
      {method: "POST", body: blob, headers: {
        "Content-Type": blob.type || "application/octet-stream", "Accept": "application/json"}});
    const text = await response.text();
    let result;
    try { result = JSON.parse(text); $("raw").textContent = JSON.stringify(result, null, 2); }
    catch (e) { $("raw").textContent = text; throw new Error("HTTP " + response.status); }
    if (!response.ok) throw new Error(result.error.code + ": " + result.error.message);
    // The gateway's pixels are those of the image as a viewer shows it (EXIF applied).
    const image = await createImageBitmap(blob, {imageOrientation: "from-image"});
    const canvas = $("canvas");
    canvas.width = image.width;
    canvas.height = image.height;
    const ctx = canvas.getContext("2d");
    ctx.drawImage(image, 0, 0);
    const line = Math.max(2, Math.round(image.width / 320));
    const size = Math.max(12, Math.round(image.width / 50));
    if (result.detections) {
      ctx.strokeStyle = BOX;
      ctx.lineWidth = line;
      for (const d of result.detections) {
        const b = d.box;
        ctx.strokeRect(b.x_min + line / 2, b.y_min + line / 2,
                       b.x_max - b.x_min - line, b.y_max - b.y_min - line);
      }
      for (const d of result.detections) {
        drawLabel(ctx, d.label + " " + d.score.toFixed(2), d.box.x_min, d.box.y_min, size);
      }
      status(result.detections.length + " detections by " + result.model.name +
             " version " + result.model.version);
    } else if (result.classes) {
      for (const c of result.classes) {
        const item = document.createElement("li");
        item.textContent = c.label + " " + c.score.toFixed(3);
        $("classes").appendChild(item);
      }
      if (result.classes.length) {
        const top = result.classes[0];
        drawLabel(ctx, top.label + " " + top.score.toFixed(2), 0, 0, size);
      }
      status("Top classes by " + result.model.name + " version " + result.model.version);
    } else {
      status("Result by " + result.model.name + " version " + result.model.version);
    }
    document.body.dataset.state = "done";
  } catch (error) {
    status(String(error.message || error), true);
    document.body.dataset.state = "error";
  }
}
$("file").addEventListener("change", () => { if ($("file").files[0]) run($("file").files[0]); });
select.addEventListener("change", () => { if ($("file").files[0]) run($("file").files[0]); });
const query = new URLSearchParams(location.search);
if (query.get("model")) select.value = query.get("model");
if (query.get("min_score")) $("min_score").value = query.get("min_score");
if (query.get("image")) {
  fetch(query.get("image")).then((r) => r.blob()).then(run).catch((error) => {
    status("cannot load " + query.get("image") + ": " + error, true);
    document.body.dataset.state = "error";
  });
}
__JOBS_SCRIPT__
</script>
</body>
</html>
"""


def _script_json(value: object) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(registry: ModelRegistry, bindings: Bindings, jobs: bool = False) -> str:
    """The page, with each model's task and each task's route verb (`detect`, ...); `jobs`:
    with the batch jobs view (gateway.frontends.http.jobs_page)."""
    models = {name: registry.task_of(name) for name in {registry.default_model, *registry.models}}
    verbs = {binding.task: binding.verb for binding in bindings}
    return (
        _PAGE.replace("__MODELS__", _script_json(dict(sorted(models.items()))))
        .replace("__VERBS__", _script_json(verbs))
        .replace("__DEFAULT__", _script_json(registry.default_model))
        .replace("__BOX__", BOX_COLOUR)
        .replace("__JOBS_HTML__", jobs_page.HTML if jobs else "")
        .replace("__JOBS_SCRIPT__", jobs_page.SCRIPT if jobs else "")
    )

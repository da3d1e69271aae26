// The page's own script (gateway/frontends/http/page.py says what it is and the renderers'
// contract). Before it: MODELS {model: task}, VERBS {task: verb}, OPTIONS {verb: inputs},
// PIPELINES {name: {detect, verb, steps, options}}, ANSWERS (where a pipeline's answer holds the
// tasks' answers), DEFAULT_MODEL, BOX (the first colour) and RENDERERS {verb: async (result,
// view) => ...}, one per task with a page.js.
const $ = (id) => document.getElementById(id);
const select = $("model");
for (const [name, task] of Object.entries(MODELS)) {
  const option = document.createElement("option");
  option.value = name;
  option.textContent = name + " (" + task + ")";
  option.selected = name === DEFAULT_MODEL;
  select.appendChild(option);
}
// Pipelines are picked in the same list; their values cannot be a model's (a model's name
// holds no ":", the HTTP route's separator).
const PIPELINE = "pipeline:";
if (Object.keys(PIPELINES).length) {
  const group = document.createElement("optgroup");
  group.label = "Pipelines";
  for (const [name, pipeline] of Object.entries(PIPELINES)) {
    const steps = pipeline.steps.map((step) => step.name + " (" + step.model + ")");
    group.appendChild(new Option(name + ": " + pipeline.detect + ", then " + steps.join(", "),
                                 PIPELINE + name));
  }
  select.appendChild(group);
}
// The pipeline picked, or null for a model.
function pickedPipeline() {
  return select.value.startsWith(PIPELINE) ? select.value.slice(PIPELINE.length) : null;
}
function pickedOptions() {
  const pipeline = pickedPipeline();
  return pipeline === null ? OPTIONS[VERBS[MODELS[select.value]]] || []
                           : PIPELINES[pipeline].options;
}
// The chosen model's task options (OPTIONS[verb]: name, kind, description, choices): an
// input each, empty for the model's default; values typed in are kept by name across models.
const typed = {};
function showOptions() {
  const span = $("options");
  for (const input of span.querySelectorAll("[name]")) typed[input.name] = input.value;
  span.textContent = "";
  for (const option of pickedOptions()) {
    let input;
    if (option.kind === "choice") {
      input = document.createElement("select");
      input.add(new Option("model default", ""));
      for (const [number, name] of option.choices) input.add(new Option(name, String(number)));
    } else {
      input = document.createElement("input");
      input.type = option.kind === "text" ? "text" : "number";
      input.step = option.kind === "integer" ? "1" : "any";
      input.placeholder = "model default";
    }
    input.name = option.name;
    input.id = "option-" + option.name;
    input.value = typed[option.name] ?? "";
    const label = document.createElement("label");
    label.title = option.description;
    label.append(option.name.replace(/_/g, " ") + " ", input);
    span.appendChild(label);
  }
}
// {name: value} of the options filled in, numbers as numbers.
function chosenOptions() {
  const values = {};
  for (const option of pickedOptions()) {
    const input = $("option-" + option.name);
    if (!input || input.value === "") continue;
    values[option.name] = option.kind === "text" ? input.value : Number(input.value);
  }
  return values;
}
function status(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}
// Distinct colours for instances (BOX first), each far from grey and from the others.
const PALETTE = [BOX, "#00c853", "#2962ff", "#ff6d00", "#00b8d4", "#ffd600", "#aa00ff",
                 "#d50000", "#64dd17", "#c51162"];
const MASK_ALPHA = 0.45;
function rgb(colour) {
  return [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
}
// What a renderer draws with (the contract is in page.py's docstring).
function makeView(ctx, width, height) {
  const line = Math.max(2, Math.round(width / 320));
  const size = Math.max(12, Math.round(width / 50));
  const view = {
    ctx: ctx, width: width, height: height, line: line, size: size, list: $("rows"),
    status: (text) => status(text, false),
    served: (result) => {
      const model = result.model || {};
      return (model.name || "?") + " version " + (model.version ?? "?");
    },
    colour: (i) => PALETTE[((i % PALETTE.length) + PALETTE.length) % PALETTE.length],
    row: (text) => {
      const item = document.createElement("li");
      item.textContent = text;
      view.list.appendChild(item);
      return item;
    },
    drawLabel: (text, x, y, colour = BOX) => {
      ctx.font = size + "px sans-serif";
      const wide = ctx.measureText(text).width + 6;
      const top = y - size - 4 >= 0 ? y - size - 4 : y;
      ctx.fillStyle = colour;
      ctx.fillRect(x, top, wide, size + 4);
      ctx.fillStyle = "#ffffff";
      ctx.textBaseline = "top";
      ctx.fillText(text, x + 3, top + 2);
    },
    drawBox: (box, text, colour = BOX) => {
      // The stroke runs just inside the box, so that its edges are the box's own.
      ctx.strokeStyle = colour;
      ctx.lineWidth = line;
      ctx.strokeRect(box.x_min + line / 2, box.y_min + line / 2,
                     box.x_max - box.x_min - line, box.y_max - box.y_min - line);
      if (text) view.drawLabel(text, box.x_min, box.y_min, colour);
    },
    drawPoint: (x, y, colour = BOX) => {
      ctx.beginPath();
      ctx.arc(x, y, line * 1.5 + 1, 0, 2 * Math.PI);
      ctx.fillStyle = colour;
      ctx.fill();
      ctx.lineWidth = 1;
      ctx.strokeStyle = "#ffffff";
      ctx.stroke();
    },
    drawLine: (x0, y0, x1, y1, colour = BOX) => {
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.lineTo(x1, y1);
      ctx.strokeStyle = colour;
      ctx.lineWidth = line;
      ctx.stroke();
    },
    paintMask: (bits, maskWidth, maskHeight, colour = BOX) => {
      const layer = document.createElement("canvas");
      layer.width = maskWidth;
      layer.height = maskHeight;
      const pixels = new ImageData(maskWidth, maskHeight);
      const [r, g, b] = rgb(colour);
      for (let i = 0; i < maskWidth * maskHeight; i++) {
        if (bits[i]) pixels.data.set([r, g, b, 255], 4 * i);
      }
      layer.getContext("2d").putImageData(pixels, 0, 0);
      ctx.save();
      ctx.globalAlpha = MASK_ALPHA;
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(layer, 0, 0, width, height);
      ctx.restore();
    },
  };
  return view;
}
// A task without a renderer: the JSON below is all there is to see.
async function generic(result, view) {
  view.status("Result by " + view.served(result) + " (the JSON is below)");
}
// Draws `blob` (the image as a viewer shows it: EXIF applied, as the gateway sees it), then
// `result` over it with the renderer of `verb`.
async function show(verb, result, blob) {
  await paint(result, blob, (view) => (RENDERERS[verb] || generic)(result, view));
}
// A pipeline's answer: the first step's answer drawn by its task's renderer, then under each
// instance's label a caption per step that attached a result to it, in the steps' order.
async function showPipeline(result, blob) {
  await paint(result, blob, async (view) => {
    const field = Object.keys(ANSWERS.first).find((name) => result[name]);
    if (!field) throw new Error("the pipeline's answer holds no first step's answer to draw");
    const [verb, listed] = ANSWERS.first[field];
    const first = result[field];
    await (RENDERERS[verb] || generic)(first, view);
    const found = listed ? first[listed] || [] : [];
    const order = (result.steps || []).map((step) => step.name);
    const line = view.size + 6;
    for (const instance of result.instances || []) {
      const id = instance.id || 0;
      const box = (found[id] || {}).box;
      const steps = instance.steps || {};
      const texts = order.filter((name) => steps[name]).map((name) => caption(name, steps[name]));
      if (!box || !texts.length) continue;
      // On the lines under the task's own label (above the box, or inside it at the top edge).
      const top = box.y_min - line >= 0 ? box.y_min - line : box.y_min;
      texts.forEach((text, k) => {
        view.drawLabel(text, box.x_min, top + (k + 1) * line + view.size + 4, view.colour(id));
      });
      const row = view.row("#" + id + " " + found[id].label + ": " + texts.join(", "));
      row.style.borderLeft = "0.8em solid " + view.colour(id);
      row.style.paddingLeft = "4px";
    }
    const steps = (result.steps || []).map((step) => {
      const model = step.model ? " by " + view.served(step) : "";
      const skipped = (step.skipped || []).map((s) => s.count + " skipped (" + s.reason + ")");
      return [step.name + ": " + (step.crops || 0) + " crops" + model,
              ...(step.failed ? [step.failed + " failed"] : []), ...skipped].join(", ");
    });
    status("Pipeline " + result.pipeline + ": " + $("status").textContent + "; " +
           steps.join("; "));
  });
}
// gRPC's status codes by number, as google.rpc.Status carries them.
const CODES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
               "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
               "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
               "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"];
// One attached result as a caption (the client's --draw writes the same: gateway/client/
// pipelines.py): "step: <top label> <score>" for an answer listing labelled items (and +N
// more found), "step: N values" for a vector, "step: none", or a failed crop's code.
function caption(name, attached) {
  if (attached.error) return name + ": " + (CODES[attached.error.code || 0] || "failed");
  const field = ANSWERS.steps.find((f) => attached[f]);
  let labelled = null, numbers = null;
  for (const value of Object.values(field ? attached[field] : {})) {
    if (!Array.isArray(value) || !value.length) continue;
    if (!labelled && typeof value[0] === "object" && "label" in value[0]) labelled = value;
    else if (!numbers && typeof value[0] === "number") numbers = value;
  }
  if (labelled) {
    const top = labelled[0];
    const more = "box" in top && labelled.length > 1 ? " +" + (labelled.length - 1) : "";
    return name + ": " + top.label + " " + (top.score ?? 0).toFixed(2) + more;
  }
  return name + ": " + (numbers ? numbers.length + " values" : "none");
}
// The image, then what `draw(view)` draws over it; the JSON below.
// A format the gateway reads but this browser cannot show (TIFF in most) gets a blank canvas
// of the result's size.
async function paint(result, blob, draw) {
  $("raw").textContent = JSON.stringify(result, null, 2);
  $("rows").textContent = "";
  let image = null;
  try { image = await createImageBitmap(blob, {imageOrientation: "from-image"}); }
  catch (error) { image = null; }
  // The result's pixels: those of the image, unless it says otherwise.
  const width = result.image_width || (image ? image.width : 0);
  const height = result.image_height || (image ? image.height : 0);
  const canvas = $("canvas");
  canvas.width = image ? image.width : width;
  canvas.height = image ? image.height : height;
  const ctx = canvas.getContext("2d");
  if (image) {
    ctx.drawImage(image, 0, 0);
    ctx.scale(image.width / width, image.height / height);
  } else {
    ctx.fillStyle = "#e0e0e0";
    ctx.fillRect(0, 0, width, height);
  }
  await draw(makeView(ctx, width, height));
  if (!image) {
    status($("status").textContent + " (this browser cannot show the image: drawn on a blank)");
  }
}
async function run(blob) {
  document.body.dataset.state = "running";
  const pipeline = pickedPipeline();
  const model = select.value;
  const verb = VERBS[MODELS[model]];
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(chosenOptions())) params.set(name, String(value));
  status("Running " + (pipeline ?? model) + " ...");
  $("rows").textContent = "";
  const route = pipeline === null ? "/v1/models/" + encodeURIComponent(model) + ":" + verb
                                  : "/v1/pipelines/" + encodeURIComponent(pipeline) + ":run";
  try {
    const response = await fetch(
      route + "?" + params,
      {method: "POST", body: blob, headers: {
        "Content-Type": blob.type || "application/octet-stream", "Accept": "application/json"}});
    const text = await response.text();
    let result;
    try { result = JSON.parse(text); }
    catch (e) { $("raw").textContent = text; throw new Error("HTTP " + response.status); }
    if (!response.ok) {
      $("raw").textContent = JSON.stringify(result, null, 2);
      const error = result.error || {};
      throw new Error((error.code || "HTTP " + response.status) + ": " + error.message);
    }
    if (pipeline === null) await show(verb, result, blob);
    else await showPipeline(result, blob);
    document.body.dataset.state = "done";
  } catch (error) {
    status(String(error.message || error), true);
    document.body.dataset.state = "error";
  }
}
$("file").addEventListener("change", () => { if ($("file").files[0]) run($("file").files[0]); });
select.addEventListener("change", () => {
  showOptions();
  if ($("file").files[0]) run($("file").files[0]);
});
const query = new URLSearchParams(location.search);
if (query.get("model")) select.value = query.get("model");
if (query.get("pipeline")) select.value = PIPELINE + query.get("pipeline");
for (const [name, value] of query) {
  if (!["model", "pipeline", "image"].includes(name)) typed[name] = value;
}
showOptions();
if (query.get("image")) {
  fetch(query.get("image")).then((r) => r.blob()).then(run).catch((error) => {
    status("cannot load " + query.get("image") + ": " + error, true);
    document.body.dataset.state = "error";
  });
}

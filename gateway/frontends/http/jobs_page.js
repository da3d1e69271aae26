// The page's jobs view: a batch job on several images or a dataset URI, its progress, and
// its results to download, through the HTTP door's jobs routes.
//
// Pick images (they go to `POST /v1/uploads` as one multipart body) or type a dataset URI the
// gateway may read, then Start: `POST /v1/batchJobs` with the page's model or pipeline, then
// `POST /v1/operations/{id}:wait` in a loop that redraws the progress until the operation is
// done; the results link is `GET /v1/operations/{id}/results` (JSON Lines). Cancel calls
// `:cancel`. `document.body.dataset.job` ends as `done` or `error`: how the browser test
// drives it. The model list, the task verbs, the pipeline picked (`pickedPipeline()`), the
// options filled in (`chosenOptions()`) and `$` come from the page's own script.
const jobs = {name: "", cancelled: false};
function jobStatus(text, error) {
  $("job-status").textContent = text;
  $("job-status").className = error ? "error" : "";
}
async function api(method, path, body) {
  const init = {method: method, headers: {"Accept": "application/json"}};
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let answer;
  try { answer = text ? JSON.parse(text) : {}; }
  catch (e) { throw new Error("HTTP " + response.status + ": " + text.slice(0, 200)); }
  if (!response.ok) {
    const error = answer.error || {};
    throw new Error((error.code || response.status) + ": " + (error.message || text));
  }
  return answer;
}
function operationPath(name) {
  return "/v1/" + name.split("/").map(encodeURIComponent).join("/");
}
function showOperation(op) {
  $("job-raw").textContent = JSON.stringify(op, null, 2);
  const meta = op.metadata || {};
  const total = Number(meta.total || 0), processed = Number(meta.processed || 0);
  const failed = Number(meta.failed || 0);
  $("job-progress").max = Math.max(total, 1);
  $("job-progress").value = processed;
  const state = meta.state || "QUEUED";
  let text = op.name + ": " + state + ", " + processed + " of " + (total || "?") + " images";
  if (failed) text += " (" + failed + " failed)";
  if (op.error) text += ": " + op.error.message;
  jobStatus(text, Boolean(op.error) && state !== "CANCELLED");
  if (op.done && !op.error) {
    const link = $("job-results");
    link.href = operationPath(op.name) + "/results";
    link.download = op.name.split("/").pop() + ".jsonl";
    link.hidden = false;
  }
}
async function startJob(event) {
  event.preventDefault();
  const files = $("job-files").files, uri = $("job-uri").value.trim();
  if (!files.length && !uri) { jobStatus("Pick images or type a dataset URI.", true); return; }
  document.body.dataset.job = "running";
  $("job-start").disabled = true;
  $("job-results").hidden = true;
  jobs.cancelled = false;
  try {
    // The model picked and its task, or the pipeline picked (its config names its models).
    const model = select.value, pipeline = pickedPipeline();
    const request = pipeline === null ? {task: VERBS[MODELS[model]], model: {name: model}}
                                      : {pipeline: pipeline};
    // The job's options: the chosen task's (or the pipeline's first model's) own, as a plain
    // object (its request message).
    const options = chosenOptions();
    if (Object.keys(options).length) request.options = options;
    if (files.length) {
      jobStatus("Uploading " + files.length + " images ...");
      const form = new FormData();
      for (const file of files) form.append("image", file, file.name);
      const upload = await api("POST", "/v1/uploads", form);
      request.upload_id = upload.upload_id;
    } else {
      request.input_uri = uri;
    }
    let op = await api("POST", "/v1/batchJobs", request);
    jobs.name = op.name;
    $("job-cancel").disabled = false;
    showOperation(op);
    while (!op.done) {
      op = await api("POST", operationPath(op.name) + ":wait?timeout=10s");
      showOperation(op);
    }
    const state = (op.metadata || {}).state;
    document.body.dataset.job = state === "SUCCEEDED" ? "done" : "error";
  } catch (error) {
    jobStatus(String(error.message || error), true);
    document.body.dataset.job = "error";
  } finally {
    $("job-start").disabled = false;
    $("job-cancel").disabled = true;
  }
}
$("job-form").addEventListener("submit", startJob);
$("job-cancel").addEventListener("click", async () => {
  if (!jobs.name) return;
  try { await api("POST", operationPath(jobs.name) + ":cancel"); }
  catch (error) { jobStatus(String(error.message || error), true); }
});

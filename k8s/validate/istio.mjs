// Validates Istio objects against the schemas of Istio's CRDs, as compiled into the typed
// models of @kubernetes-models/istio (pinned in package.json; 3.0.x has the v1 APIs).
//
// Input on stdin: a JSON array of objects. Output on stdout: a JSON array with, per object,
// {covered, errors}: covered is false when no model exists for its apiVersion and kind.
//
// The models check types, enums and required fields, but (like the CRDs) they do not list
// unknown fields as errors, and the API server with --validate=strict does. So every field is
// also probed: its value is replaced by a JavaScript Symbol, which no schema type accepts. A
// field the schema knows then fails validation at its own path; a field it does not know
// passes, and is reported as unknown.
import { readFileSync } from "node:fs";
import * as networkingV1 from "@kubernetes-models/istio/networking.istio.io/v1";
import * as networkingV1beta1 from "@kubernetes-models/istio/networking.istio.io/v1beta1";
import * as networkingV1alpha3 from "@kubernetes-models/istio/networking.istio.io/v1alpha3";
import * as securityV1 from "@kubernetes-models/istio/security.istio.io/v1";
import * as telemetryV1 from "@kubernetes-models/istio/telemetry.istio.io/v1";

const MODELS = {
  "networking.istio.io/v1": networkingV1,
  "networking.istio.io/v1beta1": networkingV1beta1,
  "networking.istio.io/v1alpha3": networkingV1alpha3,
  "security.istio.io/v1": securityV1,
  "telemetry.istio.io/v1": telemetryV1,
};

function schemaErrors(Model, data) {
  try {
    new Model(data).validate();
    return [];
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    return e.errors;
  }
}

function pointer(path) {
  return path.map((p) => "/" + String(p).replaceAll("~", "~0").replaceAll("/", "~1")).join("");
}

function withValueAt(data, path, value) {
  const copy = structuredClone(data);
  let node = copy;
  for (const key of path.slice(0, -1)) node = node[key];
  node[path[path.length - 1]] = value;
  return copy;
}

// Paths of object keys below `node` (list items are walked, not probed: they have no name).
function* keyPaths(node, path) {
  if (Array.isArray(node)) {
    for (let i = 0; i < node.length; i++) yield* keyPaths(node[i], [...path, i]);
  } else if (node !== null && typeof node === "object") {
    for (const key of Object.keys(node)) {
      yield [...path, key];
    }
  }
}

function unknownFields(Model, data) {
  const unknown = [];
  const pending = [...keyPaths(data, [])].filter((p) => !["apiVersion", "kind"].includes(p[0]));
  while (pending.length > 0) {
    const path = pending.shift();
    const where = pointer(path);
    const errors = schemaErrors(Model, withValueAt(data, path, Symbol("probe")));
    if (errors.some((e) => e.instancePath === where)) {
      let value = data;
      for (const key of path) value = value[key];
      pending.push(...keyPaths(value, path));
    } else {
      unknown.push(where);
    }
  }
  return unknown;
}

const objects = JSON.parse(readFileSync(0, "utf8"));
const results = objects.map((obj) => {
  const Model = MODELS[obj.apiVersion]?.[obj.kind];
  if (Model === undefined) return { covered: false, errors: [] };
  const errors = schemaErrors(Model, obj).map(
    (e) => `${e.instancePath || "/"}: ${e.message}${e.params?.allowedValues ? " " + JSON.stringify(e.params.allowedValues) : ""}`,
  );
  for (const where of unknownFields(Model, obj)) errors.push(`${where}: unknown field`);
  return { covered: true, errors };
});
process.stdout.write(JSON.stringify(results));

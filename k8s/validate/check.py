"""Renders every kustomize target and validates each object it produces (`make k8s-check`).

Kubernetes kinds are checked against the strict JSON schemas that kubernetes-validate ships
(unknown fields are errors, as with `kubectl apply --validate=strict`), for every Kubernetes
version in VERSIONS; all errors of an object are listed, not only the first. Istio kinds go to
istio.mjs (the schemas of @kubernetes-models/istio). An object that no validator covers is an
error too, so a new kind cannot slip through unchecked.

    python k8s/validate/check.py [KUSTOMIZATION_DIR ...]
        (default: k8s/base, k8s/overlays/*, k8s/jobs/*)
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource

HERE = Path(__file__).resolve().parent
K8S = HERE.parent
KUBECTL = Path(sys.executable).parent / "kubectl"
ISTIO_SCRIPT = HERE / "istio.mjs"
# The Kubernetes versions validated against: the one the manifests are written for (the
# acceptance check runs a 1.36 API server) and the newest that kubernetes-validate ships.
TARGET_VERSION = "1.36.0"

Obj = dict[str, Any]


def schema_root() -> Any:
    return resources.files("kubernetes_validate") / "kubernetes-json-schema"


def shipped_versions() -> list[str]:
    """Kubernetes versions with strict schemas in the installed kubernetes-validate."""
    found = []
    for entry in schema_root().iterdir():
        match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", entry.name)
        if match:
            found.append(tuple(int(g) for g in match.groups()))
    return [".".join(map(str, v)) for v in sorted(found)]


def versions() -> list[str]:
    shipped = shipped_versions()
    if TARGET_VERSION not in shipped:
        sys.exit(f"kubernetes-validate has no schemas for Kubernetes {TARGET_VERSION}")
    return sorted({TARGET_VERSION, shipped[-1]}, key=lambda v: tuple(map(int, v.split("."))))


def schema_file(obj: Obj) -> str:
    """deployment-apps-v1.json, service-v1.json, networkpolicy-networking-v1.json, ..."""
    api_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", obj["apiVersion"])
    return f"{obj['kind'].lower()}-{api_version}.json"


def is_kubernetes_group(api_version: str) -> bool:
    group = api_version.rpartition("/")[0]
    return group == "" or "." not in group or group.endswith(".k8s.io")


@functools.cache
def validator(version: str, filename: str) -> jsonschema.protocols.Validator | None:
    directory = schema_root() / f"v{version}-local-strict"
    path = directory / filename
    if not path.is_file():
        return None
    schema = json.loads(path.read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())
    registry: Registry = Resource.from_contents(definitions) @ Registry()
    registry = Resource.from_contents(schema) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def kubernetes_errors(obj: Obj, version: str) -> list[str] | None:
    """Every schema error of a Kubernetes object; None if the version has no such kind."""
    check = validator(version, schema_file(obj))
    if check is None:
        return None
    messages = []
    for error in sorted(check.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(map(str, error.absolute_path)) or "(top)"
        messages.append(f"{path}: {error.message}")
    return messages


def istio_results(objs: list[Obj]) -> list[Obj]:
    if not objs:
        return []
    if not (HERE / "node_modules").is_dir():
        sys.exit(f"{HERE}/node_modules is missing: run `make k8s-check` (npm ci there)")
    result = subprocess.run(
        ["node", str(ISTIO_SCRIPT)],
        input=json.dumps(objs),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        sys.exit(f"istio.mjs failed:\n{result.stderr}")
    results: list[Obj] = json.loads(result.stdout)
    return results


def render(target: Path) -> list[Obj]:
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {target} failed:\n{result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def ident(obj: Obj) -> str:
    return f"{obj.get('apiVersion')} {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def check(objs: list[Obj], kube_versions: list[str]) -> tuple[list[str], dict[str, int]]:
    """All problems of one render, and how many objects each validator covered."""
    problems: list[str] = []
    covered = {"kubernetes": 0, "istio": 0}
    istio: list[Obj] = []
    for obj in objs:
        if not isinstance(obj, dict) or not {"apiVersion", "kind"} <= obj.keys():
            problems.append(f"{str(obj)[:60]}...: not a Kubernetes object")
        elif is_kubernetes_group(obj["apiVersion"]):
            missing = []
            for version in kube_versions:
                errors = kubernetes_errors(obj, version)
                if errors is None:
                    missing.append(version)
                    continue
                problems += [f"{ident(obj)} (Kubernetes {version}): {e}" for e in errors]
            if missing:
                problems.append(f"{ident(obj)}: no such kind in Kubernetes {', '.join(missing)}")
            else:
                covered["kubernetes"] += 1
        else:
            istio.append(obj)
    for obj, result in zip(istio, istio_results(istio), strict=True):
        if result["covered"]:
            covered["istio"] += 1
            problems += [f"{ident(obj)} (Istio CRD schema): {e}" for e in result["errors"]]
        else:
            problems.append(f"{ident(obj)}: no validator covers this kind")
    return problems, covered


def default_targets() -> list[Path]:
    """The base, every overlay and every job (k8s/jobs/*, applied on their own)."""
    found = [
        p
        for group in ("overlays", "jobs")
        for p in sorted((K8S / group).iterdir())
        if (p / "kustomization.yaml").is_file()
    ]
    return [K8S / "base", *found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", type=Path, help="kustomization directories")
    args = parser.parse_args(argv)
    kube_versions = versions()
    failed = False
    for target in args.targets or default_targets():
        try:
            objs = render(target)
        except RuntimeError as e:
            print(f"FAIL {e}")
            failed = True
            continue
        problems, covered = check(objs, kube_versions)
        resolved = target.resolve()
        name = resolved.relative_to(K8S.parent) if resolved.is_relative_to(K8S.parent) else target
        for problem in problems:
            print(f"FAIL {name}: {problem}")
        failed |= bool(problems)
        print(
            f"{'FAIL' if problems else 'ok  '} {name}: {len(objs)} objects, "
            f"{covered['kubernetes']} against Kubernetes {' and '.join(kube_versions)} "
            f"(strict), {covered['istio']} against Istio's CRD schemas, "
            f"{len(problems)} problems"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

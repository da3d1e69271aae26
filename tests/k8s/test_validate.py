"""The manifest validator of `make k8s-check` (k8s/validate/check.py): the real renders pass,
and a broken one fails with every error listed, Istio's and unknown kinds' included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "k8s" / "validate" / "check.py"

BROKEN = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replica: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: web
          image: web:1.0
          readinesProbe: {grpc: {port: 50051}}
          livenessProbe: {grpc: {port: grpc}}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: gadget}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web}
spec:
  hosts: [web]
  http:
    - timeout: 10
      retries: {attempts: 2, retry_on: reset}
      route: [{destination: {host: web}}]
"""


def run_check(*targets: Path) -> subprocess.CompletedProcess[str]:
    if not (CHECK.parent / "node_modules").is_dir():
        pytest.fail("k8s/validate/node_modules is missing: run `make k8s-check`", pytrace=False)
    return subprocess.run(
        [sys.executable, str(CHECK), *map(str, targets)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_render_validates() -> None:
    result = run_check()
    assert result.returncode == 0, result.stdout + result.stderr
    summaries = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(summaries) >= 3  # base, dev, prod
    assert "Kubernetes 1.36.0" in summaries[0]
    assert any("10 against Istio's CRD schemas" in line for line in summaries)


def test_a_broken_render_fails_with_every_error_listed(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [objects.yaml]\n")
    (tmp_path / "objects.yaml").write_text(BROKEN)

    result = run_check(tmp_path)

    assert result.returncode == 1
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    text = "\n".join(failures)
    for version in ("1.36.0", "1.37.0"):
        # All three errors of the Deployment, not only the first.
        deployment = [f for f in failures if f"Deployment/web (Kubernetes {version})" in f]
        assert len(deployment) == 3, text
        assert any("'replica' was unexpected" in f for f in deployment)
        assert any("'readinesProbe' was unexpected" in f for f in deployment)
        assert any(
            "livenessProbe.grpc.port: 'grpc' is not of type 'integer'" in f for f in deployment
        )
    assert "Widget/gadget: no validator covers this kind" in text
    istio = [f for f in failures if "VirtualService/web (Istio CRD schema)" in f]
    assert any("/spec/http/0/timeout: must be string" in f for f in istio), text
    assert any("/spec/http/0/retries/retry_on: unknown field" in f for f in istio), text
    assert len(istio) == 2, text

"""The replica counts the docs give ("gateway 3-12, TF Serving 2-8") are the autoscalers of the
prod render: every such count in the guides, the README and the manifests' own READMEs and
comments, and at least the ones in docs/deployment.md and k8s/README.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.renders import GATEWAY, TFSERVING, find, rendered

ROOT = Path(__file__).resolve().parents[2]
# A range next to the workload it counts, either way round.
COUNTS = {
    GATEWAY: re.compile(
        r"gateway (\d+)-(\d+)\b|\b(\d+)-(\d+) gateway\b|prod autoscaler \((\d+)-(\d+) pods\)"
    ),
    TFSERVING: re.compile(r"TF Serving (\d+)-(\d+)\b|\b(\d+)-(\d+) TF Serving\b"),
}
MUST_SAY = [ROOT / "docs" / "deployment.md", ROOT / "k8s" / "README.md"]


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found += sorted(p for p in (ROOT / "k8s").rglob("*") if p.suffix in (".md", ".yaml"))
    return [p for p in found if "node_modules" not in p.parts and p.is_file()]


def autoscaled(workload: str) -> tuple[int, int]:
    spec = find(rendered("prod"), "HorizontalPodAutoscaler", workload)["spec"]
    return spec["minReplicas"], spec["maxReplicas"]


@pytest.mark.parametrize("workload", COUNTS)
def test_the_replica_counts_the_docs_give_are_the_prod_autoscalers(workload: str) -> None:
    expected = autoscaled(workload)
    quoted: dict[Path, list[tuple[int, int]]] = {}
    for page in pages():
        for match in COUNTS[workload].finditer(page.read_text()):
            low, high = (int(n) for n in match.groups() if n is not None)
            quoted.setdefault(page, []).append((low, high))
    wrong = {
        str(page.relative_to(ROOT)): counts
        for page, counts in quoted.items()
        if any(c != expected for c in counts)
    }
    low, high = expected
    assert not wrong, f"prod autoscales {workload} {low}-{high}; the docs say {wrong}"
    missing = [str(p.relative_to(ROOT)) for p in MUST_SAY if p not in quoted]
    assert not missing, f"no replica count of {workload} in {missing}"

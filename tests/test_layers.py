"""The package's import rules, read from the source: data flows down (door -> core -> task +
upstream), the doors do not import each other, and nothing imports late to dodge a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gateway"

# Imports inside functions, each with its reason; any other one fails the test (an import
# placed late to dodge a cycle hides a layering problem).
DEFERRED = {
    ("gateway.app", "gateway.frontends.http.server"): "aiohttp only when the HTTP port is on",
    ("gateway.app", "gateway.jobs.kube"): "the kubernetes client only for that executor",
    ("gateway.workers", "gateway.metrics"): "after PROMETHEUS_MULTIPROC_DIR is set",
}

# A module (prefix) may not import these (prefixes).
FORBIDDEN = {
    "gateway.errors": ["gateway."],
    # The shared nouns, on the ground floor: every floor above takes them from here.
    "gateway.domain": ["gateway."],
    "gateway.config": ["gateway."],
    "gateway.imaging": ["gateway.core", "gateway.tasks", "gateway.upstream", "gateway.frontends"],
    "gateway.upstream": ["gateway.tasks", "gateway.core", "gateway.imaging", "gateway.frontends"],
    "gateway.models": ["gateway.tasks", "gateway.core", "gateway.frontends"],
    # A task works on the shared nouns (gateway.domain) and implements the contract
    # (gateway.api.task); it knows nothing of the core that runs it or of the policy.
    "gateway.tasks": [
        "gateway.core",
        "gateway.policy",
        "gateway.frontends",
        "gateway.jobs",
        "gateway.batch",
        "gateway.client",
    ],
    # The core is handed its tasks (gateway.api.task's contract) and its policy
    # (gateway.core.ports' Protocols) by the app: it imports neither.
    "gateway.core": [
        "gateway.tasks",
        "gateway.policy",
        "gateway.frontends",
        "gateway.jobs",
        "gateway.batch",
        "gateway.client",
    ],
    "gateway.frontends.grpc": ["gateway.frontends.http"],
    "gateway.frontends.http": ["gateway.frontends.grpc"],
    # The contract sits below the doors, batch, jobs and the client: they import it, it
    # imports none of them (and the client imports it: it stays light, no pipeline).
    "gateway.api.bindings": [
        "gateway.frontends",
        "gateway.core.pipeline",
        "gateway.batch",
        "gateway.jobs",
        "gateway.client",
    ],
    # The contract: below the doors, batch, jobs, the client and check-models. Of batch and
    # jobs it takes only the plain types it converts to (PLAIN, below).
    "gateway.api": [
        "gateway.frontends",
        "gateway.client",
        "gateway.app",
        "gateway.modelcheck",
        "gateway.core",
        "gateway.tasks",
        "gateway.policy",
    ],
    # Batch reads datasets and runs them through a transport (in process: the pipeline; over
    # gRPC: a gateway, with the contract's calls); it knows no door, no job service, no client.
    "gateway.batch": [
        "gateway.frontends",
        "gateway.client",
        "gateway.jobs",
        "gateway.app",
        "gateway.modelcheck",
    ],
    # The job service runs batch work for the doors; it knows no door and no client.
    "gateway.jobs": ["gateway.frontends", "gateway.client", "gateway.app", "gateway.modelcheck"],
    "gateway.client": [
        "gateway.core.pipeline",
        "gateway.frontends.grpc",
        "gateway.frontends.http",
        "gateway.jobs",
        "gateway.batch",
        "gateway.app",
    ],
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> list[tuple[str, str, bool, int]]:
    """(module, imported module, at top level, line) for every gateway import in gateway/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "proto" in path.relative_to(PACKAGE).parts[:1]:
            continue
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set()
        for node in tree.body:
            top.add(node)
            if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks
                top.update(node.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name == "gateway" or name.startswith("gateway."):
                    found.append((module, name, node in top, node.lineno))
    return found


IMPORTS = _imports()


def _is(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix.rstrip(".") + ".")


def test_the_rules_see_the_package() -> None:
    modules = {module for module, *_ in IMPORTS}
    assert {"gateway.core.pipeline", "gateway.upstream.client", "gateway.app"} <= modules


@pytest.mark.parametrize("owner", sorted(FORBIDDEN))
def test_data_flows_down(owner: str) -> None:
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, _, line in IMPORTS
        if _is(module, owner)
        for banned in FORBIDDEN[owner]
        if _is(name, banned) and not _is(name, owner)
    ]
    assert not wrong, "\n".join(wrong)


# What the contract may take from batch and jobs: the plain types its conversions make.
PLAIN = {"gateway.api": ("gateway.batch.spec", "gateway.jobs.views")}


def test_the_contract_takes_only_plain_types_from_batch_and_jobs() -> None:
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, _, line in IMPORTS
        if _is(module, "gateway.api")
        and (_is(name, "gateway.batch") or _is(name, "gateway.jobs"))
        and not any(_is(name, plain) for plain in PLAIN["gateway.api"])
    ]
    assert not wrong, "\n".join(wrong)


def test_no_module_below_the_app_imports_it() -> None:
    wrong = [
        f"{module}:{line}"
        for module, name, _, line in IMPORTS
        if _is(name, "gateway.app") and module not in ("gateway.__main__", "gateway.app")
    ]
    assert not wrong


def test_nothing_imports_late_to_dodge_a_cycle() -> None:
    late = {(module, name): line for module, name, at_top, line in IMPORTS if not at_top}
    unexplained = [
        f"{module}:{line} imports {name} inside a function"
        for (module, name), line in late.items()
        if not any(_is(name, imported) and module == owner for owner, imported in DEFERRED)
    ]
    assert not unexplained, "\n".join(unexplained)


# The hand-written code the 400-line rule covers: the gateway (not its generated gateway/proto),
# the benchmarks, the reference models + local TF Serving, and the tests.
HAND_WRITTEN = ("gateway", "bench", "serving", "tests")


def test_no_hand_written_module_is_over_400_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for top in HAND_WRITTEN
        for path in (ROOT / top).rglob("*.py")
        if path.relative_to(ROOT).parts[:2] != ("gateway", "proto")
    }
    assert "bench/__main__.py" in sizes and "serving/local/manager.py" in sizes
    assert "tests/test_layers.py" in sizes
    over = {path: lines for path, lines in sizes.items() if lines > 400}
    assert not over, over

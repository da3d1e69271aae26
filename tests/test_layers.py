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
    ("gateway.app", "gateway.jobs.executors.kube"): "the kubernetes client only for that executor",
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
    # (gateway.api.task); it knows nothing of the core that runs it or of the policy, nor of
    # the gateway's settings: what the operator sets for a request is handed to its resolve
    # (gateway.models.limits.Rules).
    "gateway.tasks": [
        "gateway.config",
        "gateway.core",
        "gateway.policy",
        "gateway.frontends",
        "gateway.jobs",
        "gateway.client",
    ],
    # The core is handed its tasks (gateway.api.task's contract) and its policy
    # (gateway.core.ports' Protocols) by the app: it imports neither.
    "gateway.core": [
        "gateway.tasks",
        "gateway.policy",
        "gateway.frontends",
        "gateway.jobs",
        "gateway.client",
    ],
    "gateway.frontends.grpc": ["gateway.frontends.http"],
    "gateway.frontends.http": ["gateway.frontends.grpc"],
    # The contract: below the doors, the jobs wing, the client and check-models; it imports
    # none of them (the jobs' conversions live in the wing, gateway.jobs.spec.conversions).
    "gateway.api": [
        "gateway.frontends",
        "gateway.client",
        "gateway.app",
        "gateway.modelcheck",
        "gateway.core",
        "gateway.tasks",
        "gateway.policy",
        "gateway.jobs",
    ],
    # The jobs wing runs batch work for the doors; it knows no door, no client, no app. Its
    # sub-packages' arrows among themselves: WING, below.
    "gateway.jobs": ["gateway.frontends", "gateway.client", "gateway.app", "gateway.modelcheck"],
    # The runner (what detection-batch runs) reads datasets and writes outputs: no pipeline
    # in it (the in-process transport brings that), no policy.
    "gateway.jobs.runner": ["gateway.core", "gateway.policy"],
    "gateway.jobs.spec": ["gateway.core", "gateway.policy"],
    "gateway.client": [
        "gateway.core.pipeline",
        "gateway.frontends.grpc",
        "gateway.frontends.http",
        "gateway.jobs",
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


# The jobs wing's sub-packages and what each may import of the others: spec (the job, its
# record and views, the API's conversions) is its floor; the runner (datasets, outputs,
# shards, and the Transport it runs over) and the control (service, store, leases,
# admission) stand on it; transports implement the runner's Transport; executors run jobs
# with all of them. The runner's two entry points compose it with a transport.
WING = {
    "spec": set(),
    "runner": {"spec"},
    "transports": {"spec", "runner"},
    "control": {"spec", "runner"},
    "executors": {"spec", "runner", "transports", "control"},
}
ENTRY_POINTS = {
    "gateway.jobs.runner.__main__": "transports",
    "gateway.jobs.runner.child": "transports",
}


def _wing(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["gateway", "jobs"] else None


def test_the_jobs_wing_imports_down_its_own_floors() -> None:
    assert {_wing(module) for module, *_ in IMPORTS} >= set(WING)
    wrong = [
        f"{module}:{line} imports {name}"
        for module, name, _, line in IMPORTS
        if _wing(module) in WING
        and _wing(name) is not None
        and _wing(name) != _wing(module)
        and _wing(name) not in WING[str(_wing(module))]
        and ENTRY_POINTS.get(module) != _wing(name)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_two_modules_of_the_wing_share_a_name() -> None:
    modules = {m for m, *_ in IMPORTS if _wing(m) and m.count(".") > 2}
    names = [m.rsplit(".", 1)[-1] for m in modules]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def _module_edges() -> dict[str, set[str]]:
    """Module -> the gateway modules it imports; `from package import module` is an arrow to
    that module (the package's __init__ runs first, as for any import of a submodule)."""
    modules = {module for module, *_ in IMPORTS}
    edges: dict[str, set[str]] = {module: set() for module in modules}
    for module, name, _, _ in IMPORTS:
        target = name if name in modules else name.rpartition(".")[0]
        if target in modules and target != module:
            edges[module].add(target)
    return edges


def test_no_two_modules_import_each_other_through_any_circle() -> None:
    edges = _module_edges()
    assert {"gateway.core.pipeline", "gateway.api.bindings"} <= set(edges["gateway.app"])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(edges[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert circles == []


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


def test_no_test_module_imports_another() -> None:
    """Helpers live in tests/support/ (docs/testing.md): a test module that imports another
    drags its fixtures and its collection along, and hides a helper where nobody looks."""
    tests = ROOT / "tests"
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.startswith("tests.") and node.module.rsplit(".", 1)[-1].startswith(
                "test_"
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}")
    assert wrong == []

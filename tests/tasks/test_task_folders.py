"""A task is a folder (docs/adding-a-task.md): read from the source, nothing outside
gateway/tasks/<task>/ imports the task's modules except its registration (the one line of
gateway/tasks/builtin.py, which imports the folder by name); a task folder imports no other
task folder, except detection's box and score handling (which the tasks built on detection
reuse) and the shared decoders (gateway/tasks/decoders/); every folder is registered."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from gateway.tasks.builtin import FOLDERS

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "gateway" / "tasks"
# Folders of gateway/tasks/ that are not tasks, and what every task may import.
SHARED = {"decoders"}
# Task folders whose modules other tasks may reuse.
REUSABLE = {"detection"}
REGISTRATION = "gateway.tasks.builtin"
# Modules outside the folders that still name a task, each until the issue that moves it in.
NOT_YET: dict[str, str] = {}


def task_folders() -> list[str]:
    return sorted(
        path.name
        for path in TASKS.iterdir()
        if (path / "__init__.py").exists() and path.name not in SHARED
    )


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the gateway package, by dotted name."""
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if "proto" in path.relative_to(ROOT).parts[1:2]:
            continue  # generated code
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def imported(path: Path, name: str) -> set[str]:
    """The modules `path` (module `name`) imports, absolute or relative, anywhere in it."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def task_of(module: str) -> str | None:
    """The task folder a module name lies in (or names), if any."""
    parts = module.split(".")
    if parts[:2] == ["gateway", "tasks"] and len(parts) > 2 and parts[2] in task_folders():
        return parts[2]
    return None


def test_the_task_folders_are_found_and_each_is_registered_once() -> None:
    folders = task_folders()
    assert {"detection", "classification", "embedding"} <= set(folders)
    assert sorted(FOLDERS) == folders and len(set(FOLDERS)) == len(FOLDERS)


def test_only_the_registration_imports_a_task_from_outside_its_folder() -> None:
    wrong = []
    for name, path in modules():
        own = task_of(name)
        for target in imported(path, name):
            task = task_of(target)
            if task is None or task == own or name == REGISTRATION or name in NOT_YET:
                continue
            if own is not None and task in REUSABLE:
                continue  # a task built on detection (the next test's rule)
            wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert wrong == []


def test_a_task_folder_imports_no_other_task_but_detections_helpers() -> None:
    wrong = []
    for name, path in modules():
        own = task_of(name)
        if own is None:
            continue
        for target in imported(path, name):
            task = task_of(target)
            if task is not None and task != own and task not in REUSABLE:
                wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert wrong == []


def test_the_rules_see_imports() -> None:
    """The checks read what they should: the registration and a task's own imports."""
    builtin = TASKS / "builtin.py"
    assert "gateway.api.task" in imported(builtin, REGISTRATION)
    task = TASKS / "embedding" / "task.py"
    seen = imported(task, "gateway.tasks.embedding.task")
    assert "gateway.tasks.embedding.compare" in seen
    assert {task_of(m) for m in seen} >= {"embedding", None}
